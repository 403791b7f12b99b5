"""The distribution daemon: the node plays the current best model. On a lone node that is the
registry's best; in a cluster the newest committed promotion (or the model a quorum-decided
rollback returned to), fetched by sha256 from any peer that has it (a corrupt copy is refused
and fetched elsewhere), installed in the node's model store and recorded in its registry so
/progress agrees on every node.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.events import EventType
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.context import PipelineContext, wait_for_wake, wake_on
from app.coordination.pipeline.runner_settings import Polled
from app.coordination.sync.streaming import FetchError
from app.db.registry import ModelRegistry, ModelStatus, RegistryError
from app.games.train.promotion import PromotionError, promote_model, rollback_model
from app.log import get_logger


async def distribution_daemon(pipe: PipelineContext, ctx: DaemonContext[Polled]) -> None:
    """Installs the current best model in the node's model store and switches self-play to it:
    the registry's best on a lone node; in a cluster the newest committed promotion, fetched by
    sha256 from any peer that has it (a corrupt copy is refused and fetched elsewhere)."""
    wake = wake_on(ctx, EventType.MODEL_PROMOTED)
    ctx.mark_healthy()
    while True:
        try:
            target = await _target_best(pipe)
        except FetchError as exc:
            ctx.log.warning("model_fetch_failed", error=str(exc))
            target = None
        if target is not None:
            sha, path, generation = target
            await pipe.update(lambda s: ps.switched_best(s, sha, str(path), generation))
            await pipe.steps.models.switched(sha, path, generation)
            ctx.metrics.generation.set(generation)
            await ctx.router.publish(EventType.MODEL_DISTRIBUTED, {
                "generation": generation, "sha256": sha, "node_id": pipe.node_id, "path": str(path)})
            ctx.log.info("model_switched", generation=generation, sha256=sha[:12])
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


async def _target_best(pipe: PipelineContext) -> tuple[str, Path, int] | None:
    """(sha256, installed path, generation) of the model self-play should use, or None."""
    models = pipe.steps.models
    switched = lambda sha: pipe.state.best_path == str(models.installed_path(sha))  # noqa: E731
    cluster = pipe.cluster
    if cluster is None:
        best = await asyncio.to_thread(_current_best, pipe)
        if best is None or switched(best[0]):
            return None
        sha, src, generation = best
        return sha, await asyncio.to_thread(models.install, src, sha), generation
    record = cluster.target_best()
    # an older target only after a quorum-decided rollback of what this node plays (rollback.py)
    rolled_back = pipe.state.best_generation in cluster.rollbacks.records
    if record is None or (record.generation < pipe.state.best_generation and not rolled_back) \
            or switched(record.sha256):
        return None
    if not await asyncio.to_thread(models.is_installed, record.sha256):
        await models.fetch(cluster.node, record.sha256)
    path = models.installed_path(record.sha256)
    if rolled_back:  # back to an earlier model: the registry follows as a rollback, not a promotion
        await asyncio.to_thread(_registry_rollback, pipe, record.sha256, pipe.state.best_generation)
    else:
        await asyncio.to_thread(_register_promoted, pipe, path, record.generation, record.reason)
    return record.sha256, path, record.generation


def _current_best(pipe: PipelineContext) -> tuple[str, str, int] | None:
    with ModelRegistry(pipe.paths.registry_db) as registry:
        best = registry.current_best()
        return None if best is None else (best.sha256, best.path, best.generation)


def _register_promoted(pipe: PipelineContext, path: Path, generation: int, reason: str) -> None:
    """Record a model the cluster promoted in this node's registry, so /progress agrees."""
    with ModelRegistry(pipe.paths.registry_db) as registry:
        entry = registry.require(pipe.steps.models.register_installed(registry, path, generation))
        if entry.status is ModelStatus.CANDIDATE:
            promote_model(registry, entry.sha256, f"committed by the cluster: {reason}"[:500])


def _registry_rollback(pipe: PipelineContext, sha256: str, generation: int) -> None:
    """Mirror the cluster's rollback in this node's registry, so its /progress agrees (best
    effort: a node that never registered the earlier model has nothing to roll back to)."""
    with ModelRegistry(pipe.paths.registry_db) as registry:
        best = registry.current_best()
        if best is None or best.sha256 == sha256:
            return
        try:
            rollback_model(registry, sha256, f"cluster rolled back generation {generation}")
        except (PromotionError, RegistryError) as exc:
            get_logger(__name__).warning("registry_rollback_failed", sha256=sha256[:12], error=str(exc))
