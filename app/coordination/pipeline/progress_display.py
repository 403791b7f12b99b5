"""The operator's one-line view of the loop: generation, stage, games, loss, last gauntlet.

Printed to stdout every few seconds when something changed (structlog keeps stderr for
machine-readable lines), so `make run` in a terminal shows the loop moving.
"""

from __future__ import annotations

import asyncio
import sys
from typing import TextIO

from app.coordination.daemons.metrics import Metrics
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.state import PipelineState


def describe(state: PipelineState, games: int, loss: float | None, last_gauntlet: str) -> str:
    """Pure: the status line for a state."""
    best = f"gen {state.best_generation} ({state.best_sha256[:10]})" if state.best_sha256 else "untrained"
    parts = [
        f"generation {state.generation}: {state.stage.value}",
        f"games {games} (+{max(0, games - state.export_mark)} new)",
        f"best {best}",
        f"promoted {state.promoted} rejected {state.rejected}",
    ]
    if loss is not None:
        parts.append(f"loss {loss:.3f}")
    if last_gauntlet:
        parts.append(f"last gauntlet {last_gauntlet}")
    return " | ".join(parts)


def summarize_evaluation(evaluation: dict) -> str:
    return ", ".join(
        f"{r['kind']} {r['wins']}-{r['draws']}-{r['losses']}" for r in evaluation.get("results", [])
    )


async def show_progress(pipe: PipelineContext, metrics: Metrics, interval_s: float = 5.0,
                        out: TextIO = sys.stdout) -> None:
    """Runs until cancelled."""
    last_line = ""
    last_gauntlet = ""
    while True:
        state = pipe.state
        if state.evaluation:
            last_gauntlet = summarize_evaluation(state.evaluation)
        games = await asyncio.to_thread(pipe.newest_item_id)
        loss = metrics.value("mesh_training_loss")
        line = describe(state, games, loss or None, last_gauntlet)
        if line != last_line:
            print(line, file=out, flush=True)
            last_line = line
        await asyncio.sleep(interval_s)
