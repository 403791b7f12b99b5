"""The operator's view of the loop moving: generation, stage, games, loss, last gauntlet.

Logged as a `progress` event every few seconds when something changed, through structlog like
every other line: JSON on a pipe (one format in one stream, for collectors), the console
renderer on a terminal (`make run`), where it reads as one line per change.
"""

from __future__ import annotations

import asyncio
from typing import Any

from app.coordination.daemons.metrics import Metrics
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.state import PipelineState
from app.log import get_logger

log = get_logger(__name__)


def describe(state: PipelineState, games: int, loss: float | None, last_gauntlet: str) -> dict[str, Any]:
    """Pure: the fields of the progress event for a state (absent: not known yet)."""
    fields: dict[str, Any] = {
        "generation": state.generation, "stage": state.stage.value,
        "games": games, "new_games": max(0, games - state.export_mark),
        "best_generation": state.best_generation if state.best_sha256 else None,
        "best_sha256": state.best_sha256[:12] if state.best_sha256 else None,
        "promoted": state.promoted, "rejected": state.rejected,
    }
    if loss is not None:
        fields["loss"] = round(loss, 4)
    if last_gauntlet:
        fields["last_gauntlet"] = last_gauntlet
    return fields


def summarize_evaluation(evaluation: dict) -> str:
    return ", ".join(
        f"{r['kind']} {r['wins']}-{r['draws']}-{r['losses']}" for r in evaluation.get("results", [])
    )


async def show_progress(pipe: PipelineContext, metrics: Metrics, interval_s: float = 5.0) -> None:
    """Runs until cancelled."""
    last: dict[str, Any] = {}
    last_gauntlet = ""
    while True:
        state = pipe.state
        if state.evaluation:
            last_gauntlet = summarize_evaluation(state.evaluation)
        games = await asyncio.to_thread(pipe.newest_item_id)
        loss = metrics.value("mesh_training_loss")
        fields = describe(state, games, loss or None, last_gauntlet)
        if fields != last:
            log.info("progress", **fields)
            last = fields
        await asyncio.sleep(interval_s)
