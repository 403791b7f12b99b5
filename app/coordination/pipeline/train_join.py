"""The `train_join` daemon: this node lends itself to another node's training run.

When a claimant spans a generation's training over several nodes, it gossips a rendezvous and
the leader schedules `training_join:generation-<g>-<run>-rank-<k>` items (app/coordination/scheduling).
On every node this daemon, whenever the node is not training a generation of its own, claims
one (/work/claim_training, kind training_join), then:

  1. fetches the claimant's dataset by sha256 (signed, every file verified against the manifest)
     and the parent model by sha256 if it lacks it;
  2. runs the launcher as node rank k against the claimant's master addr/port, in its own run
     dir `runs/join_gen_<g>` (training_job builds the command and owns the subprocess, so a
     stopping daemon tears its ranks down as a lone run's would);
  3. renews the claim while that runs; completes it on success (writing `join_result.json`),
     fails it with the error otherwise.

Only global rank 0 (the claimant) writes checkpoints and the candidate, so nothing a joiner
does outlives the run except its logs and that result file.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.p2p.work_rules import TRAINING_JOIN_KIND
from app.coordination.p2p.worker import Claim, WorkClient
from app.coordination.daemons.events import EventType
from app.coordination.pipeline.context import PipelineContext, wait_for_wake, wake_on
from app.coordination.pipeline.feedback_loops import checked_options
from app.coordination.pipeline.runner_settings import ClaimPolled
from app.coordination.pipeline.launcher_process import launcher_log_tail, run_launcher
from app.coordination.pipeline.training_job import SpanArgs, launcher_command
from app.coordination.pipeline.state import Stage

JOIN_RESULT_NAME = "join_result.json"


def join_run_dir(pipe: PipelineContext, generation: int) -> Path:
    return pipe.paths.runs_dir / f"join_gen_{generation:04d}"


async def train_join_daemon(pipe: PipelineContext, ctx: DaemonContext[ClaimPolled]) -> None:
    """Claims join items while this node is free (no generation of its own in flight); a new
    leader (LEADER_ELECTED) is asked at once, the poll is the safety net."""
    wake = wake_on(ctx, EventType.LEADER_ELECTED)
    ctx.mark_healthy()
    while not ctx.stopping.is_set():
        cluster = pipe.cluster
        if cluster is not None and cluster.current is None and pipe.state.stage is Stage.COLLECTING:
            work = cluster.work_client()
            claim = await work.claim(training=True, kinds=[TRAINING_JOIN_KIND])
            if claim is not None:
                await join_claimed(pipe, ctx, work, claim)
                continue
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return


async def join_claimed(pipe: PipelineContext, ctx: DaemonContext, work: WorkClient, claim: Claim) -> None:
    payload = claim.item.payload
    ctx.log.info("training_join_claimed", item=claim.item.item_id, claimant=payload.get("claimant"),
                 master=f"{payload.get('master_addr')}:{payload.get('master_port')}")
    renewer = asyncio.create_task(_renew_loop(work, claim, ctx))
    started = time.monotonic()
    try:
        error = await join_run(pipe, ctx, payload)
    except Exception as exc:  # noqa: BLE001 - any failure fails the claim, never the daemon
        error = f"{type(exc).__name__}: {exc}"
    finally:
        renewer.cancel()
    if error is None and ctx.stopping.is_set():
        error = "node stopping"
    if error is None:
        await work.complete(claim, {"node_rank": int(payload["node_rank"])})
        ctx.log.info("training_join_completed", item=claim.item.item_id, wall_s=round(time.monotonic() - started, 1))
    else:
        await work.fail(claim, error[-2000:])
        ctx.log.warning("training_join_failed", item=claim.item.item_id, error=error[-500:])


async def join_run(pipe: PipelineContext, ctx: DaemonContext, payload: dict[str, Any]) -> str | None:
    """Fetch what rank k needs and run it; None on success, else why it failed."""
    if pipe.cluster is None:
        return "this node left the cluster"
    node = pipe.cluster.node
    generation, rank = int(payload["generation"]), int(payload["node_rank"])
    claimant = str(payload["claimant"])
    addr = node.addr_of(claimant)
    if not addr:
        return f"no address known for the claimant {claimant}"
    dataset_dir = await pipe.steps.fetch_dataset(node, str(payload["dataset_sha256"]), [addr])
    parent = payload.get("parent_sha256")
    # fetch_model returns at once when the model is installed and verified
    parent_path = await pipe.steps.models.fetch(node, parent) if parent else None
    run_dir = join_run_dir(pipe, generation)
    span = SpanArgs(int(payload["nnodes"]), rank, str(payload["master_addr"]), int(payload["master_port"]),
                    float(pipe.settings.train.join_timeout_s))
    cmd = join_command(pipe, payload, run_dir=run_dir, dataset_dir=dataset_dir, parent=parent_path, span=span)
    code = await run_launcher(cmd, run_dir, ctx)
    if code != 0:
        return f"launcher exit code {code}: {launcher_log_tail(run_dir)}"
    atomic_write_json(run_dir / JOIN_RESULT_NAME, {
        "status": "completed", "generation": generation, "node_rank": rank, "nnodes": span.nnodes,
        "claimant": claimant, "run_id": payload.get("run_id"), "dataset_sha256": payload["dataset_sha256"]}, indent=2)
    return None


def join_command(pipe: PipelineContext, payload: dict[str, Any], *, run_dir: Path, dataset_dir: str | Path,
                 parent: str | Path | None, span: SpanArgs) -> list[str]:
    """Rank k's launcher command: the claimant's trainer options (the quality loop's lr/batch
    from its rendezvous), checked against this node's bounds, so every rank derives the same
    schedule; out of bounds raises ValueError (the join claim fails, naming it)."""
    settings = pipe.settings
    options = checked_options(payload.get("train_options"), settings.train, settings.feedback.quality)
    return launcher_command(pipe, run_dir=run_dir, dataset_dir=dataset_dir, generation=int(payload["generation"]),
                            parent=parent, nproc=int(settings.train.nproc), span=span, options=options)


async def _renew_loop(work: WorkClient, claim: Claim, ctx: DaemonContext) -> None:
    """Keep the join claim alive; a lost one is only logged: the rendezvous is already joined and
    the run ends with the claimant's, so stopping this rank would only fail everyone's."""
    outcome = await work.keep_alive(claim)
    ctx.log.warning("training_join_claim_lost", item=claim.item.item_id, reason=outcome.reason)
