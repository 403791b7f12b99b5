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
import math
import functools

from app.coordination.daemons.daemon_registry import DaemonContext, RunnerEntry
from app.coordination.daemons.events import EventType
from app.coordination.pipeline.shard_worker import gauntlet_shards_daemon
from app.coordination.pipeline.generation_log import GenerationRecord
from app.coordination.pipeline.evaluation_record import match_summary
from app.coordination.pipeline.context import PipelineContext, wait_for_wake, wake_on
from app.coordination.sync.streaming import FetchError
from app.coordination.pipeline.train_join import train_join_daemon
from app.coordination.pipeline.replication_daemon import ReplicationSettings, replication_daemon
from app.coordination.pipeline.resident_trainer import ResidentTrainer
from app.coordination.pipeline.training_job import run_training
from app.coordination.pipeline.distribution import distribution_daemon
from app.db.registry import ModelRegistry, ModelStatus
from app.coordination.pipeline import feedback_apply as feedback
from app.coordination.pipeline import state as ps
from app.games.train.gauntlet import GauntletStopped
from app.coordination.pipeline.runner_settings import (
    ClaimPolled, ExportSettings, Polled, SelfplaySettings, TrainSettings,
)
from app.coordination.pipeline.state import Stage
from app.coordination.pipeline.steps import Cluster, PullsBeforeExport, ReportsStatus, RunsOn, Verdict
from app.games.train.promotion import promote_model, reject_model


HEAD_RECORD_WAIT_S = 30.0  # a claimant waits this long for the decided record before its generation


async def selfplay_daemon(pipe: PipelineContext, ctx: DaemonContext[SelfplaySettings]) -> None:
    """Plays batches of games (or rollout groups) with the current best model (the untrained
    one before the first)."""
    cfg = ctx.settings
    ctx.mark_healthy()
    try:
        while not ctx.stopping.is_set():
            state = pipe.state
            evaluating = state.stage is Stage.TRAINED or (pipe.gate is not None and pipe.gate.evaluating())
            if cfg.pause_while_evaluating and evaluating:  # any config's gauntlet on this node
                await pipe.wait_for_change(1.0)  # two cores: leave them to the gauntlet
                ctx.mark_healthy()
                continue
            summary = await _selfplay_batch(pipe, cfg, ctx)
            total = await asyncio.to_thread(pipe.newest_item_id)
            ctx.metrics.selfplay_items_total.inc(summary.items)
            ctx.metrics.selfplay_samples_total.inc(summary.samples)
            ctx.metrics.selfplay_samples_per_second.set(summary.samples_per_second)
            ctx.metrics.selfplay_workers.set(summary.workers)
            if (noise := feedback.exploration(pipe)) is not None:  # what the batch played with
                ctx.metrics.selfplay_dirichlet_fraction.set(noise.fraction or pipe.settings.search.dirichlet_fraction)
            for reason, count in summary.dropped.items():
                ctx.metrics.selfplay_items_dropped_total.labels(reason).inc(count)
            if summary.items:
                await ctx.router.publish(EventType.NEW_ITEMS_AVAILABLE, {"count": summary.items, "total": total})
            ctx.mark_healthy()
            if cfg.rest_s and await ctx.sleep(cfg.rest_s):
                break
    finally:
        pipe.steps.close_selfplay()  # takes no lock: returns within seconds even mid-batch


async def _selfplay_batch(pipe: PipelineContext, cfg: SelfplaySettings, ctx: DaemonContext[SelfplaySettings]):
    """One batch; with several configs on the node, in this config's turn (lineage_gate.py)."""
    if pipe.gate is None:
        return await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, cfg, ctx.stopping.is_set)
    async with pipe.gate.selfplay_turn(pipe.config_name) as played:
        summary = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, cfg, ctx.stopping.is_set)
        played(summary.workers)
    return summary


async def export_daemon(pipe: PipelineContext, ctx: DaemonContext[ExportSettings]) -> None:
    """Turns the newest games into a dataset when a generation is due: enough new local games
    on a lone node; a training claim from the leader in a cluster (after pulling peers' games).
    A decided generation wakes it too: the games that arrived while the last one trained are
    often enough already, and waiting for the next batch or the poll left the node idle."""
    wake = wake_on(ctx, EventType.NEW_ITEMS_AVAILABLE, EventType.LEADER_ELECTED, EventType.QUORUM_CHANGED,
                   EventType.MODEL_PROMOTED, EventType.PROMOTION_REJECTED)
    if pipe.cluster is not None and pipe.state.stage is not Stage.COLLECTING and pipe.cluster.current is None:
        await pipe.update(ps.abandoned)  # a restart lost the claim: the leader reschedules it
    ctx.mark_healthy()
    while True:
        if pipe.state.stage is Stage.COLLECTING:
            if pipe.cluster is not None:
                await _export_claimed_generation(pipe, pipe.cluster, ctx)
            else:
                await _export_if_due(pipe, ctx)
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


async def _export_if_due(pipe: PipelineContext, ctx: DaemonContext[ExportSettings]) -> None:
    newest = await asyncio.to_thread(pipe.newest_item_id)
    state = pipe.state
    due = ps.should_export(state, newest, pipe.export_threshold)
    if pipe.gate is not None:  # several configs: a generation due steps aside for one further below its share
        pipe.gate.claimed(pipe.config_name, due)
        if due and not pipe.gate.may_claim(pipe.config_name):
            return
    if due:
        await _export(pipe, ctx, state.generation, newest, newest - state.export_mark, pipe.export_threshold)


async def _export_claimed_generation(pipe: PipelineContext, cluster: Cluster, ctx: DaemonContext[ExportSettings]) -> None:
    gate = pipe.gate  # several configs: one generation at a time, for the config the shares pick
    if gate is not None and cluster.current is None and not gate.may_claim(pipe.config_name):
        return
    claim = await cluster.claim_generation()
    if gate is not None:
        gate.claimed(pipe.config_name, claim is not None)
    if claim is None:
        return
    if isinstance(pipe.steps, PullsBeforeExport):  # else the items arrive by replication alone
        synced = await pipe.steps.sync_before_export(cluster.node, ctx.settings.sync_budget_s)
        ctx.log.info("games_synced", generation=claim.generation, **synced)
    newest = await asyncio.to_thread(pipe.newest_item_id)
    await pipe.update(lambda s: ps.adopt_generation(s, claim.generation))
    await _export(pipe, ctx, claim.generation, newest, claim.games_mark, 0)


async def _export(pipe: PipelineContext, ctx: DaemonContext[ExportSettings], generation: int, newest: int,
                  new_games: int, threshold: int) -> None:
    out = pipe.paths.datasets_dir / f"gen_{generation:04d}"
    sha, items = await asyncio.to_thread(pipe.steps.export, pipe, generation, out)
    state = await pipe.update(lambda s: ps.exported(s, str(out), sha, newest))
    ctx.log.info("dataset_exported", generation=state.generation, games=items, path=str(out))
    await feedback.after_export(pipe, pipe.steps, ctx, state.generation, out)  # before training reads it
    await ctx.router.publish(EventType.TRAINING_THRESHOLD_REACHED, {
        "generation": state.generation, "new_games": max(0, new_games), "threshold": threshold})


async def train_daemon(pipe: PipelineContext, ctx: DaemonContext[TrainSettings]) -> None:
    """Trains the candidate of an exported generation; resumes an interrupted run."""
    wake = wake_on(ctx, EventType.TRAINING_THRESHOLD_REACHED)
    job = pipe.steps.training
    resident = ResidentTrainer(job) if job.follow_flag is not None else None  # its trainer stays between generations
    try:
        await _train_generations(pipe, ctx, wake, resident)
    finally:
        if resident is not None:
            await resident.stop()


async def _train_generations(pipe: PipelineContext, ctx: DaemonContext[TrainSettings], wake: asyncio.Event,
                             resident: ResidentTrainer | None) -> None:
    failures = 0
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage in (Stage.EXPORTED, Stage.TRAINING):
            if state.stage is Stage.EXPORTED and pipe.cluster is not None:
                await resolve_head(pipe, pipe.cluster, ctx)
                if ctx.stopping.is_set():
                    return
                state = pipe.state
                if state.stage is not Stage.EXPORTED:
                    continue  # the claim was lost while the record was awaited
            run_dir = state.run_dir or str(pipe.paths.runs_dir / f"gen_{state.generation:04d}")
            state = await pipe.update(lambda s: ps.training_started(s, run_dir))
            await ctx.router.publish(EventType.TRAINING_STARTED, {
                "generation": state.generation, "node_id": pipe.node_id, "dataset_sha256": state.dataset_sha256})
            outcome = await run_training(pipe, state, ctx, resident)
            if ctx.stopping.is_set():
                return  # interrupted: the run dir keeps its checkpoint for the restart
            if outcome.error is None:
                failures = 0
                sha = await asyncio.to_thread(_register_candidate, pipe, outcome.candidate_path, state.generation)
                state = await pipe.update(lambda s: ps.trained(s, outcome.candidate_path, sha))
                if outcome.final_loss is not None:
                    ctx.metrics.training_loss.set(outcome.final_loss)
                await ctx.router.publish(EventType.TRAINING_COMPLETED, {
                    "generation": state.generation, "candidate_path": outcome.candidate_path,
                    "candidate_sha256": sha, "parent_sha256": ps.parent(state)[1],
                    "dataset_sha256": state.dataset_sha256, "final_loss": outcome.final_loss or 0.0})
            else:
                failures += 1
                await pipe.update(ps.training_failed)
                await ctx.router.publish(EventType.TRAINING_FAILED, {
                    "generation": state.generation, "node_id": pipe.node_id, "error": outcome.error[-2000:]})
                if failures >= ctx.settings.max_failures:
                    raise RuntimeError(f"training of generation {state.generation} failed {failures} times: {outcome.error[-500:]}")
                if await ctx.sleep(min(60.0, 2.0 ** failures)):
                    return
                continue
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


async def resolve_head(pipe: PipelineContext, cluster: Cluster, ctx: DaemonContext) -> None:
    """Clustered: train from the head the decided records name (the best unless the workload
    runs on from a rejected candidate), fetched by sha256 from a peer when this node lacks it;
    a head no peer can serve is left for the best, logged. The leader scheduled this generation
    once the one before was decided; its record may still be on its way here (gossip), and it
    decides the parent, so it is awaited (bounded)."""
    previous = pipe.state.generation - 1
    deadline = asyncio.get_running_loop().time() + HEAD_RECORD_WAIT_S
    while previous >= 1 and previous not in cluster.generations.records:
        if await ctx.sleep(0.5):
            return  # stopping: the stage stays EXPORTED, resolved at the next start
        if asyncio.get_running_loop().time() > deadline:
            ctx.log.warning("trainer_head_unknown", generation=pipe.state.generation,
                            why=f"generation {previous}'s decided record not here: the parent is the newest known")
            break
    head = cluster.trainer_head()
    sha, path, generation = None, None, 0
    if head is not None and head.sha256 != pipe.state.best_sha256:
        models = pipe.steps.models
        try:
            if not await asyncio.to_thread(models.is_installed, head.sha256):
                await models.fetch(cluster.node, head.sha256)
            sha, path, generation = head.sha256, str(models.installed_path(head.sha256)), head.generation
        except FetchError as exc:
            ctx.log.warning("trainer_head_unavailable", generation=head.generation, sha256=head.sha256[:12],
                            why=f"{exc}: training from the best")
    await pipe.update(lambda s: ps.head_resolved(s, sha, path, generation) if s.stage is Stage.EXPORTED else s)


async def gauntlet_daemon(pipe: PipelineContext, ctx: DaemonContext[Polled]) -> None:
    """Evaluates a trained candidate: the gauntlet against baselines and the current best, or
    (language models) held-out prompts paired against the best."""
    wake = wake_on(ctx, EventType.TRAINING_COMPLETED)
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage is Stage.TRAINED:
            try:
                evaluation = await pipe.steps.evaluate(pipe, state, ctx)
            except GauntletStopped:
                return  # draining: the stage stays TRAINED and the next start plays it again
            state = await pipe.update(lambda s: ps.evaluated(s, evaluation.record))
            await ctx.router.publish(EventType.EVALUATION_COMPLETED, {
                "generation": state.generation, "candidate_sha256": state.candidate_sha256,
                "passed": evaluation.passed, "results": evaluation.results})
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


async def promote_daemon(pipe: PipelineContext, ctx: DaemonContext[Polled]) -> None:
    """Applies the promotion gates to an evaluated candidate and records the decision; in a
    cluster the decision counts only once the leader committed it through a voter quorum."""
    wake = wake_on(ctx, EventType.EVALUATION_COMPLETED, EventType.QUORUM_CHANGED)
    ctx.mark_healthy()
    while True:
        state = pipe.state
        if state.stage is Stage.EVALUATED:
            # A restart after the registry recorded the promotion finds the candidate already
            # distributed as the best: it is not a previous best to beat (else the SPRT gate,
            # never played for generation 1, would now reject what was promoted: decided twice).
            has_best = state.best_sha256 is not None and state.best_sha256 != state.candidate_sha256
            decision = pipe.steps.decide(pipe, state, has_best)
            generation, sha, path = state.generation, state.candidate_sha256, state.candidate_path
            head = not decision.promote and isinstance(pipe.steps, RunsOn) and pipe.steps.keeps_head(pipe, state, decision)
            # installed before it is proposed, so peers can fetch it once it is committed: a promoted
            # candidate in a cluster, and a head anywhere (the next claimant may be a peer; a
            # snapshot, which leaves run dirs out, keeps it)
            installed = await asyncio.to_thread(pipe.steps.models.install, path, sha) \
                if head or (decision.promote and pipe.cluster is not None) else None
            head_path = str(installed) if head else None
            if pipe.cluster is not None:
                # the loss rides on the record only for the plateau loop (off by default): records stay
                # byte for byte what a node of the previous version commits, so a rolling upgrade decides on
                loss = (await asyncio.to_thread(feedback.final_loss, pipe, state.run_dir)
                        if pipe.settings.feedback.plateau.enabled else None)
                record = cluster_record(pipe, pipe.cluster, state, decision, loss, head)
                committed, why = await pipe.cluster.propose(record)
                if not committed:
                    ctx.log.warning("decision_not_committed", generation=generation, why=why)
                    await asyncio.to_thread(_record_decision, pipe, sha, False, f"not committed: {why}")
                    await pipe.update(ps.abandoned)
                    continue
            await asyncio.to_thread(_record_decision, pipe, sha, decision.promote, decision.summary())
            await pipe.update(lambda s: ps.decided(s, decision.promote, head_path=head_path))
            await feedback.after_decision(pipe, ctx, state, decision.promote,
                                          record if pipe.cluster is not None else None)
            if decision.promote:
                ctx.metrics.promotions_total.inc()
                ctx.metrics.generation.set(generation)
                await ctx.router.publish(EventType.MODEL_PROMOTED, {"generation": generation, "sha256": sha, "path": path})
            else:
                await ctx.router.publish(EventType.PROMOTION_REJECTED, {
                    "generation": generation, "candidate_sha256": sha, "reason": decision.summary()})
            ctx.log.info("generation_decided", generation=generation, promoted=decision.promote, why=decision.summary(),
                         next_trains_from="this candidate" if head else "the best")
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


def cluster_record(pipe: PipelineContext, cluster: Cluster, state: ps.PipelineState,
                   decision: Verdict, loss: float | None = None, head: bool = False) -> GenerationRecord:
    claim = cluster.current
    steps = pipe.steps
    return GenerationRecord(
        generation=state.generation, sha256=state.candidate_sha256, promoted=decision.promote,
        games_mark=claim.games_mark if claim is not None else 0, trained_by=pipe.node_id,
        reason=decision.summary()[:500],
        heldout=steps.heldout(state.evaluation) if isinstance(steps, ReportsStatus) else None,
        matches=match_summary(state.evaluation),
        loss=loss if loss is not None and math.isfinite(loss) else None, head=head,
    )


def _register_candidate(pipe: PipelineContext, path: str, generation: int) -> str:
    with ModelRegistry(pipe.paths.registry_db) as registry:
        return pipe.steps.models.register_candidate(registry, path, generation)


def _record_decision(pipe: PipelineContext, sha256: str, promote: bool, reason: str) -> None:
    """Idempotent: a restart between the registry write and the state write repeats nothing."""
    with ModelRegistry(pipe.paths.registry_db) as registry:
        entry = registry.require(sha256)
        if entry.status is not ModelStatus.CANDIDATE:
            return
        (promote_model if promote else reject_model)(registry, sha256, reason)


def pipeline_runners(pipe: PipelineContext) -> dict[str, RunnerEntry]:
    """The runner table of the pipeline daemons: name -> runner bound to `pipe`, and the
    schema of the settings daemons.yaml may set for it (app/coordination/pipeline/runner_settings.py)."""
    bind = lambda fn: functools.partial(fn, pipe)  # noqa: E731
    return {
        "selfplay": RunnerEntry(bind(selfplay_daemon), SelfplaySettings),
        "export": RunnerEntry(bind(export_daemon), ExportSettings),
        "train": RunnerEntry(bind(train_daemon), TrainSettings),
        "train_join": RunnerEntry(bind(train_join_daemon), ClaimPolled),
        "gauntlet": RunnerEntry(bind(gauntlet_daemon), Polled),
        "gauntlet_shards": RunnerEntry(bind(gauntlet_shards_daemon), ClaimPolled),
        "promote": RunnerEntry(bind(promote_daemon), Polled),
        "distribution": RunnerEntry(bind(distribution_daemon), Polled),
        "replication": RunnerEntry(bind(replication_daemon), ReplicationSettings),
    }
