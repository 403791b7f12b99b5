"""Scores each promoted model on the solver-scored positions, off the hot path.

A background task of the node (started by the orchestrator beside the dashboard sampler):
it wakes on every pipeline change and every `interval_s`, finds the promoted models this node
has installed and has not scored yet, and scores each in a worker thread
(app/games/train/solved_accuracy.py), one model at a time, on the node's one torch thread. The
results land in `<data_dir>/solved_accuracy.json`; the dashboard feed reads that file and
gossips it with the other per-model stats, so every node shows every promoted model's accuracy
whichever node scored it.

Silent where there is nothing to score against: another game, the LM workload, or no
positions file (`gauntlet.solved_positions`, by default the shared benchmark beside the repo).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.games.search.model_meta import ModelFormatError
from app.coordination.pipeline.context import PipelineContext
from app.db.registry import ModelRegistry, RegistryError
from app.log import get_logger
from app.games.train.solved_accuracy import (
    ACCURACY_FILE, AccuracyCache, positions_file, score_raw_network,
)
from app.games.train.solved_eval import SolvedEvalError, load_positions

log = get_logger(__name__)


def promoted_models(pipe: PipelineContext) -> list[tuple[str, Path | None]]:
    """(sha256, its file if the registry knows one) of every model the cluster (or this lone
    node) promoted, oldest first."""
    if pipe.cluster is not None:
        records = pipe.cluster.generations.records
        return [(records[g].sha256, None) for g in sorted(records) if records[g].promoted]
    try:
        with ModelRegistry(pipe.paths.registry_db) as registry:
            return [(m.sha256, Path(m.path)) for m in sorted(registry.models(), key=lambda m: m.generation)
                    if m.promoted_at is not None]
    except RegistryError:
        return []


def model_file(pipe: PipelineContext, sha: str, known: Path | None) -> Path | None:
    """The installed copy, else the file the registry names (a lone node's candidate that
    distribution skipped past), else None: not on this node (another node scores it)."""
    if pipe.steps.models.is_installed(sha):
        return pipe.steps.models.installed_path(sha)
    return known if known is not None and known.is_file() else None


async def watch_strength(pipe: PipelineContext, interval_s: float = 10.0) -> None:
    """Until cancelled (returns at once when there is nothing to score against)."""
    if pipe.settings.workload == "lm":
        return
    path = positions_file(pipe.settings.gauntlet.solved_positions, pipe.settings.node.game)
    if path is None or not path.is_file():
        return
    try:
        positions = await asyncio.to_thread(load_positions, path)
    except SolvedEvalError as exc:
        log.warning("solved_positions_unusable", error=str(exc))
        return
    cache = AccuracyCache(pipe.paths.data_dir / ACCURACY_FILE)
    failed: set[str] = set()  # models that would not load: logged once, not tried again this run
    while True:
        try:
            done = await asyncio.to_thread(cache.load)
            for sha, known in await asyncio.to_thread(promoted_models, pipe):
                path = None if sha in done or sha in failed else await asyncio.to_thread(model_file, pipe, sha, known)
                if path is None:
                    continue
                try:
                    result = await asyncio.to_thread(_score, pipe, sha, path, positions)
                except ModelFormatError as exc:
                    failed.add(sha)
                    log.warning("solved_accuracy_model_unusable", sha256=sha[:12], error=str(exc))
                    continue
                await asyncio.to_thread(cache.add, sha, result)
                done[sha] = result
                log.info("solved_accuracy_scored", sha256=sha[:12], **result)
        except Exception:  # noqa: BLE001 - a measurement must never stop the node
            log.exception("solved_accuracy_failed")
        await pipe.wait_for_change(interval_s)


def _score(pipe: PipelineContext, sha: str, path: Path, positions: list) -> dict[str, float]:
    import torch  # loaded once a model is scored, not when the node starts

    torch.set_num_threads(1)  # the node process's torch work runs on one thread (match_games.py)
    return score_raw_network(path, positions, pipe.settings.node.game, sha256=sha)
