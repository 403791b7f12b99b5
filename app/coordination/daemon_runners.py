"""One small async runner per pipeline daemon.

Each runner is level-triggered: an event (or a periodic tick) wakes it, it reads the
persisted PipelineState, and it does the one step its stage asks for, then records the
transition and publishes the event that wakes the next daemon. After a crash or restart the
same loop finds the stage where it was left and carries on: a generation half-trained
resumes from its checkpoint, an evaluated one gets its decision, nothing runs twice.
Long work (self-play, export, the gauntlet) runs in worker processes or threads, training in
a `torchrun` subprocess, so the event loop stays free for the mesh and health servers.
"""

from __future__ import annotations

import asyncio
import functools
import random
from typing import Any

from app.coordination.daemon_registry import DaemonContext, RunnerEntry
from app.coordination.events import EventType
from app.coordination.pipeline_context import PipelineContext, wait_for_wake, wake_on
from app.coordination.training_job import run_training
from app.db.registry import ModelRegistry, ModelStatus
from app.db.replay_db import ReplayDB
from app.training import pipeline_state as ps
from app.training.evaluation_record import decide_from_evaluation, evaluation_from_report
from app.training.export import export_dataset
from app.training.gauntlet import run_gauntlet
from app.training.model_store import install_model
from app.training.pipeline_state import Stage
from app.training.promotion import Gates, promote_model, register_candidate, reject_model
from app.training.selfplay import run_selfplay


async def selfplay_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Plays batches of games with the current best model (uniform prior before the first)."""
    cfg = ctx.settings
    ctx.mark_healthy()
    while not ctx.stopping.is_set():
        state = pipe.state
        if cfg["pause_while_evaluating"] and state.stage is Stage.TRAINED:
            await pipe.wait_for_change(1.0)  # two cores: leave them to the gauntlet
            ctx.mark_healthy()
            continue
        summary = await asyncio.to_thread(
            run_selfplay, games=cfg["batch_games"], simulations=cfg["simulations"] or pipe.settings.search.simulations,
            db_path=pipe.paths.games_db, model_path=state.best_path, workers=cfg["workers"],
            seed=random.randrange(2**31), node_id=pipe.node_id, settings=pipe.settings,
            should_stop=ctx.stopping.is_set,
        )
        total = await asyncio.to_thread(pipe.newest_game_id)
        ctx.metrics.games_total.inc(summary.games)
        ctx.metrics.positions_per_second.set(summary.positions_per_second)
        if summary.games:
            await ctx.router.publish(EventType.NEW_GAMES_AVAILABLE, {"count": summary.games, "total": total})
        ctx.mark_healthy()


async def export_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Turns the newest games into a dataset once enough arrived since the last one."""
    wake = wake_on(ctx, EventType.NEW_GAMES_AVAILABLE)
    threshold = int(ctx.settings["min_new_games"])
    ctx.mark_healthy()
    while True:
        newest = await asyncio.to_thread(pipe.newest_game_id)
        state = pipe.state
        if ps.should_export(state, newest, threshold):
            new_games = newest - state.export_mark
            out = pipe.paths.datasets_dir / f"gen_{state.generation:04d}"
            cfg = pipe.settings.export
            result = await asyncio.to_thread(
                export_dataset, [pipe.paths.games_db], out, window_games=cfg.window_games,
                holdout_fraction=cfg.holdout_fraction, augment=cfg.augment, overwrite=True,
            )
            state = await pipe.update(lambda s: ps.exported(s, str(out), result.dataset_sha256, newest))
            ctx.log.info("dataset_exported", generation=state.generation, games=result.manifest["counts"]["games"], path=str(out))
            await ctx.router.publish(EventType.TRAINING_THRESHOLD_REACHED, {
                "generation": state.generation, "new_games": new_games, "threshold": threshold})
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings["poll_s"]):
            return


async def train_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Trains the candidate of an exported generation; resumes an interrupted run."""
    wake = wake_on(ctx, EventType.TRAINING_THRESHOLD_REACHED)
    failures = 0
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage in (Stage.EXPORTED, Stage.TRAINING):
            run_dir = state.run_dir or str(pipe.paths.runs_dir / f"gen_{state.generation:04d}")
            state = await pipe.update(lambda s: ps.training_started(s, run_dir))
            await ctx.router.publish(EventType.TRAINING_STARTED, {
                "generation": state.generation, "node_id": pipe.node_id, "dataset_sha256": state.dataset_sha256})
            outcome = await run_training(pipe, state, ctx)
            if ctx.stopping.is_set():
                return  # interrupted: the run dir keeps its checkpoint for the restart
            if outcome.error is None:
                failures = 0
                sha = await asyncio.to_thread(_register, pipe, outcome.candidate_path)
                state = await pipe.update(lambda s: ps.trained(s, outcome.candidate_path, sha))
                if outcome.final_loss is not None:
                    ctx.metrics.training_loss.set(outcome.final_loss)
                await ctx.router.publish(EventType.TRAINING_COMPLETED, {
                    "generation": state.generation, "candidate_path": outcome.candidate_path,
                    "candidate_sha256": sha, "parent_sha256": state.best_sha256,
                    "dataset_sha256": state.dataset_sha256, "final_loss": outcome.final_loss or 0.0})
            else:
                failures += 1
                await pipe.update(ps.training_failed)
                await ctx.router.publish(EventType.TRAINING_FAILED, {
                    "generation": state.generation, "node_id": pipe.node_id, "error": outcome.error[-2000:]})
                if failures >= ctx.settings["max_failures"]:
                    raise RuntimeError(f"training of generation {state.generation} failed {failures} times: {outcome.error[-500:]}")
                if await ctx.sleep(min(60.0, 2.0 ** failures)):
                    return
                continue
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings["poll_s"]):
            return


def _register(pipe: PipelineContext, candidate_path: str) -> str:
    with ModelRegistry(pipe.paths.registry_db) as registry:
        return register_candidate(registry, candidate_path).sha256


async def gauntlet_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Plays a trained candidate against the baselines and the current best."""
    wake = wake_on(ctx, EventType.TRAINING_COMPLETED)
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage is Stage.TRAINED:
            gates = Gates.from_config(pipe.settings.promotion)
            report = await asyncio.to_thread(
                run_gauntlet, state.candidate_path, gates.baselines(), state.best_path, pipe.settings,
                pipe.paths.registry_db, workers=ctx.settings["workers"], seed=state.generation,
            )
            evaluation = evaluation_from_report(report)
            passed = decide_from_evaluation(evaluation, gates, has_best=state.best_sha256 is not None).promote
            state = await pipe.update(lambda s: ps.evaluated(s, evaluation))
            await ctx.router.publish(EventType.EVALUATION_COMPLETED, {
                "generation": state.generation, "candidate_sha256": state.candidate_sha256, "passed": passed,
                "results": {r["kind"]: {k: r[k] for k in ("wins", "draws", "losses", "score")}
                            for r in evaluation["results"]}})
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings["poll_s"]):
            return


async def promote_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Applies the promotion gates to an evaluated candidate and records the decision."""
    wake = wake_on(ctx, EventType.EVALUATION_COMPLETED)
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage is Stage.EVALUATED:
            gates = Gates.from_config(pipe.settings.promotion)
            decision = decide_from_evaluation(state.evaluation, gates, has_best=state.best_sha256 is not None)
            await asyncio.to_thread(_record_decision, pipe, state.candidate_sha256, decision.promote, decision.summary())
            generation, sha, path = state.generation, state.candidate_sha256, state.candidate_path
            await pipe.update(lambda s: ps.decided(s, decision.promote))
            if decision.promote:
                ctx.metrics.promotions_total.inc()
                ctx.metrics.generation.set(generation)
                await ctx.router.publish(EventType.MODEL_PROMOTED, {"generation": generation, "sha256": sha, "path": path})
            else:
                await ctx.router.publish(EventType.PROMOTION_REJECTED, {
                    "generation": generation, "candidate_sha256": sha, "reason": decision.summary()})
            ctx.log.info("generation_decided", generation=generation, promoted=decision.promote, why=decision.summary())
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings["poll_s"]):
            return


def _record_decision(pipe: PipelineContext, sha256: str, promote: bool, reason: str) -> None:
    """Idempotent: a restart between the registry write and the state write repeats nothing."""
    with ModelRegistry(pipe.paths.registry_db) as registry:
        entry = registry.require(sha256)
        if entry.status is not ModelStatus.CANDIDATE:
            return
        (promote_model if promote else reject_model)(registry, sha256, reason)


async def distribution_daemon(pipe: PipelineContext, ctx: DaemonContext) -> None:
    """Publishes the registry's current best to the node's model store and switches self-play to it."""
    wake = wake_on(ctx, EventType.MODEL_PROMOTED)
    ctx.mark_healthy()
    while True:
        best = await asyncio.to_thread(_current_best, pipe)
        state = pipe.state
        if best is not None and state.best_path != str(pipe.paths.model_path(best[0])):
            sha, src, generation = best
            path = await asyncio.to_thread(install_model, src, pipe.paths.models_dir, sha)
            await pipe.update(lambda s: ps.switched_best(s, sha, str(path), generation))
            await ctx.router.publish(EventType.MODEL_DISTRIBUTED, {
                "generation": generation, "sha256": sha, "node_id": pipe.node_id, "path": str(path)})
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings["poll_s"]):
            return


def _current_best(pipe: PipelineContext) -> tuple[str, str, int] | None:
    with ModelRegistry(pipe.paths.registry_db) as registry:
        best = registry.current_best()
        return None if best is None else (best.sha256, best.path, best.generation)


def pipeline_runners(pipe: PipelineContext) -> dict[str, RunnerEntry]:
    """The runner table of the pipeline daemons: name -> runner bound to `pipe`, and the
    settings keys daemons.yaml may set for it (with their defaults)."""
    bind = lambda fn: functools.partial(fn, pipe)  # noqa: E731
    poll: dict[str, Any] = {"poll_s": 5.0}
    return {
        "selfplay": RunnerEntry(bind(selfplay_daemon), {
            "batch_games": 64, "simulations": 0, "workers": 1, "pause_while_evaluating": True}),
        "export": RunnerEntry(bind(export_daemon), {**poll, "min_new_games": 2000}),
        "train": RunnerEntry(bind(train_daemon), {**poll, "max_failures": 5}),
        "gauntlet": RunnerEntry(bind(gauntlet_daemon), {**poll, "workers": 1}),
        "promote": RunnerEntry(bind(promote_daemon), dict(poll)),
        "distribution": RunnerEntry(bind(distribution_daemon), dict(poll)),
    }
