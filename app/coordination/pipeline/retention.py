"""What a node deletes once generations are decided, so that a lineage that trains for days does
not fill its disk.

Each generation left on disk, unbounded before: its run dir's checkpoints (a game run's
`checkpoint.pt`, a language model's `sft/` and `rl/`: the weights with the optimizer's state,
~3x the model), its dataset, and for every rejected candidate kept as the trainer's head an
installed copy in the model store (a language model's GRPO runs on from its head, so most of its
generations install one). With a 124M-parameter model that was ~2.5 GB a generation. None of it
is read again once a newer generation is decided.

Kept: everything of the generation in progress (a restart resumes it); the runs that made the
best and the head (the next run continues that run's optimizer, training_job.parent_run); the
newest `keep_datasets` datasets of decided generations; each run's candidate, result and
metrics (the registry names the candidate, the dashboard reads the losses); in the model store
the best, the head and every model ever promoted (rollback targets), and anything this node
cannot name as a superseded candidate: only a model decided as not promoted, and neither best
nor head now, is removed. The decision is `plan` (pure); `sweep` reads the disk and deletes.
"""

from __future__ import annotations

import asyncio
import re
import shutil
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from app.coordination.daemons.metrics import Metrics
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.generation_log import trainer_head
from app.db.registry import ModelRegistry, RegistryError
from app.db.registry_tables import ModelStatus
from app.log import get_logger

log = get_logger(__name__)
GENERATION_DIR = re.compile(r"gen_(\d{4,})")  # runs/gen_NNNN, datasets/gen_NNNN (runners.py, training_job.py)
KEEP_DATASETS = 2


@dataclass(frozen=True)
class Lineage:
    """What the node knows is decided: the generation in progress, and the models to keep or
    known to be superseded (sha256s)."""

    generation: int  # in progress: every generation below it is decided
    keep_runs: frozenset[int]  # the best's and the head's generations
    keep_models: frozenset[str]  # best, head, every promoted model
    superseded: frozenset[str]  # decided and not promoted, below the generation in progress


@dataclass(frozen=True)
class Plan:
    checkpoints: list[Path] = field(default_factory=list)  # files and dirs inside decided run dirs
    datasets: list[Path] = field(default_factory=list)
    models: list[str] = field(default_factory=list)  # sha256s to remove from the model store


def generation_dirs(root: Path) -> dict[int, Path]:
    """gen_NNNN children of `root` by generation."""
    if not root.is_dir():
        return {}
    return {int(m.group(1)): p for p in root.iterdir() if (m := GENERATION_DIR.fullmatch(p.name)) and p.is_dir()}


def run_checkpoints(runs_dir: Path, patterns: Collection[str]) -> dict[int, list[Path]]:
    """Each run's checkpoints on disk (files or dirs matching the workload's patterns), by generation."""
    return {g: sorted({p for pattern in patterns for p in run.glob(pattern)})
            for g, run in generation_dirs(runs_dir).items()}


def plan(lineage: Lineage, checkpoints: Mapping[int, Sequence[Path]], datasets: Mapping[int, Path],
         installed: Collection[str], keep_datasets: int = KEEP_DATASETS) -> Plan:
    """What goes (pure): the checkpoints of decided runs but the best's and the head's, the
    datasets of decided generations but the newest `keep_datasets`, the installed models known
    to be superseded."""
    decided = lambda g: g < lineage.generation  # noqa: E731
    doomed = [p for g in sorted(checkpoints) if decided(g) and g not in lineage.keep_runs for p in checkpoints[g]]
    old = sorted(g for g in datasets if decided(g))
    stale = old[:max(0, len(old) - max(0, keep_datasets))]
    models = sorted(sha for sha in installed if sha in lineage.superseded and sha not in lineage.keep_models)
    return Plan(doomed, [datasets[g] for g in stale], models)


def lineage_of(pipe: PipelineContext) -> Lineage:
    """From the decided records (a cluster) or the registry (a lone node), and the pipeline state.
    A candidate counts as superseded only below the generation in progress: the registry (or a
    record) says "rejected" a moment before the state names that candidate the head."""
    state = pipe.state
    keep = {s for s in (state.best_sha256, state.head_sha256) if s}
    superseded: set[str] = set()
    if pipe.cluster is not None:
        records = pipe.cluster.generations.records
        head = trainer_head(pipe.cluster.effective_records())
        keep |= {r.sha256 for r in records.values() if r.promoted} | ({head.sha256} if head else set())
        superseded = {r.sha256 for r in records.values() if not r.promoted and r.generation < state.generation}
    else:
        try:
            with ModelRegistry(pipe.paths.registry_db) as registry:
                models = registry.models()
        except RegistryError:
            models = []
        keep |= {m.sha256 for m in models if m.promoted_at is not None}
        superseded = {m.sha256 for m in models if m.status is ModelStatus.REJECTED and m.promoted_at is None
                      and m.generation < state.generation}
    runs = {g for g in (state.best_generation, state.head_generation if state.head_sha256 else 0) if g > 0}
    return Lineage(state.generation, frozenset(runs), frozenset(keep), frozenset(superseded))


def sweep(pipe: PipelineContext, keep_datasets: int = KEEP_DATASETS) -> dict[str, dict[str, int]]:
    """Delete what `plan` says: per kind, how many paths and bytes (for the log and metrics).
    Runs in a worker thread; a path that cannot be removed is logged and left."""
    todo = plan(lineage_of(pipe), run_checkpoints(pipe.paths.runs_dir, pipe.steps.training.checkpoint_names),
                generation_dirs(pipe.paths.datasets_dir), pipe.steps.models.installed(), keep_datasets)
    freed = {kind: {"removed": len(paths), "bytes": sum(_remove(p) for p in paths)}
             for kind, paths in (("checkpoints", todo.checkpoints), ("datasets", todo.datasets)) if paths}
    if todo.models:
        freed["models"] = {"removed": len(todo.models), "bytes": sum(_remove_model(pipe, sha) for sha in todo.models)}
    return freed


async def watch_retention(pipe: PipelineContext, metrics: Metrics, interval_s: float = 30.0) -> None:
    """Until cancelled: a sweep each time the generation in progress moved on (a decision), and
    once at start (what a node from before this module left behind). Off with `node.retention: false`."""
    if not pipe.settings.node.retention:
        return
    swept_for = 0
    while True:
        generation = pipe.state.generation
        if generation != swept_for:
            try:
                freed = await asyncio.to_thread(sweep, pipe, pipe.settings.node.keep_datasets)
            except Exception:  # noqa: BLE001 - a cleanup must never stop the node
                log.exception("retention_failed")
            else:
                swept_for = generation
                for kind, done in freed.items():
                    metrics.retention_freed_bytes_total.labels(kind=kind).inc(done["bytes"])
                if freed:
                    log.info("retention_swept", generation=generation, **freed)
        await pipe.wait_for_change(interval_s)


def _remove(path: Path) -> int:
    """Bytes freed by deleting `path` (a file or a dir; gone already: 0)."""
    if not path.exists():
        return 0
    try:
        if path.is_dir():
            size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            shutil.rmtree(path)
            return size
        size = path.stat().st_size
        path.unlink()
        return size
    except OSError as exc:
        log.warning("retention_not_removed", path=str(path), error=str(exc))
        return 0


def _remove_model(pipe: PipelineContext, sha256: str) -> int:
    """Through the workload's model store, which knows what one model is on disk."""
    try:
        return pipe.steps.models.remove(sha256)
    except OSError as exc:
        log.warning("retention_not_removed", model=sha256[:12], error=str(exc))
        return 0
