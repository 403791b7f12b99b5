"""Runs one generation's training as a `torchrun` subprocess and reports how it ended.

The launcher is a child of the node (launcher_process.py). Stopping the daemon stops the run;
its checkpoint stays in the run dir and the next start resumes it. A lone run of a workload
whose trainer stays (`TrainingJob.follow_flag`) is handed to the trainer of the generation
before when it can take it, and launched otherwise (resident_trainer.py).

Spanning: when the training claim asks for several nodes (payload `nnodes`), the claimant
picks a free port on its mesh host, gossips the rendezvous, and runs node rank 0 of a static
multi-node launch (so the checkpoint and candidate land here, as on a lone run); the joiners
(app/coordination/pipeline/train_join.py) run the other node ranks with the same command builder. If
they do not all arrive within `train.join_timeout_s`, the claimant trains alone.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.feedback_apply import train_options
from app.coordination.pipeline.launcher_process import launcher_log_tail, run_launcher
from app.coordination.pipeline.resident_trainer import ResidentTrainer
from app.free_ports import free_port
from app.shared.launcher import JOIN_TIMEOUT_EXIT, resolve_nproc
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.state import PipelineState

@dataclass(frozen=True)
class TrainingOutcome:
    candidate_path: str
    final_loss: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class SpanArgs:
    """This node's place in a static multi-node launch (rank 0 hosts the store)."""

    nnodes: int
    node_rank: int
    master_addr: str
    master_port: int
    join_timeout_s: float


def launcher_command(pipe: PipelineContext, *, run_dir: Path, dataset_dir: str | Path, generation: int,
                     parent: str | Path | None, nproc: int, span: SpanArgs | None = None,
                     options: Mapping[str, float | int] | None = None, continue_from: Path | None = None) -> list[str]:
    """The launcher command line of one node's part of a training run (the whole run when alone);
    `options`: trainer options over the config's (`lr`, `batch_size`: the quality loop's).
    `nproc` 0 (one per GPU) is resolved here, as the launcher would (app/shared/gpus.py)."""
    cmd = [sys.executable, "-m", "app.shared.launcher", "--nproc", str(resolve_nproc(nproc)),
           "--log-dir", str(run_dir / "logs"), "--log-format", "json"]
    if span is not None:
        cmd += ["--nnodes", str(span.nnodes), "--node-rank", str(span.node_rank), "--master-addr", span.master_addr,
                "--master-port", str(span.master_port), "--join-timeout-s", str(span.join_timeout_s)]
    cmd += ["--module", pipe.steps.training.module, "--", "--dataset", str(dataset_dir), "--run-dir", str(run_dir),
            "--resume", "auto", "--generation", str(generation)]
    if pipe.config_path is not None:
        cmd += ["--config", str(pipe.config_path)]
    if parent is not None:
        cmd += ["--parent", str(parent)]
    if continue_from is not None and pipe.steps.training.continue_flag is not None:
        cmd += [pipe.steps.training.continue_flag, str(continue_from)]
    if pipe.cluster is not None and pipe.steps.training.mesh_flag is not None:
        cmd += [pipe.steps.training.mesh_flag, str(pipe.paths.data_dir.resolve())]
    for key, value in sorted((options or {}).items()):
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    return cmd


def training_command(pipe: PipelineContext, state: PipelineState, nproc: int, span: SpanArgs | None = None) -> list[str]:
    """The claimant's part of a run, lone or spanned, with the quality loop's decided options;
    a spanned run's joiners get the same options from its rendezvous (rendezvous_record), so
    every rank derives the same schedule."""
    return launcher_command(pipe, run_dir=Path(state.run_dir), dataset_dir=state.dataset_dir,
                            generation=state.generation, parent=ps.parent(state)[0], nproc=nproc, span=span,
                            options=train_options(pipe, state),
                            continue_from=parent_run(pipe, state) if span is None else None)


def parent_run(pipe: PipelineContext, state: PipelineState) -> Path | None:
    """The run dir on this node that made the parent (the head's generation, else the best's),
    when it is here: the trainer checks that its candidate is the parent before it continues
    that run's optimizer (app/lm/train/continuation.py). A spanned run's joiners have none, so
    a spanned run starts fresh."""
    generation = state.head_generation if state.head_path is not None else state.best_generation
    if pipe.steps.training.continue_flag is None or generation < 1:
        return None
    run = pipe.paths.runs_dir / f"gen_{generation:04d}"
    return run if (run / pipe.steps.training.result_name).is_file() else None


async def _train(pipe: PipelineContext, state: PipelineState, ctx: DaemonContext,
                 span: SpanArgs | None, resident: ResidentTrainer | None = None) -> tuple[TrainingOutcome, int]:
    run_dir = Path(state.run_dir)
    cmd = training_command(pipe, state, int(pipe.settings.train.nproc), span)
    if resident is not None and span is None:  # the daemon makes one only for a trainer that takes a follow file
        code = await resident.train(cmd, run_dir, state.generation, state.dataset_dir, ps.parent(state), ctx)
    else:
        code = await run_launcher(cmd, run_dir, ctx)
    candidate = run_dir / pipe.steps.training.candidate_name
    if code != 0 or not candidate.exists():
        return TrainingOutcome(str(candidate), error=f"launcher exit code {code}: {launcher_log_tail(run_dir)}"), code
    final_loss = None
    result_file = run_dir / pipe.steps.training.result_name
    if result_file.exists():
        final_loss = pipe.steps.training.final_loss(json.loads(result_file.read_text()))
    return TrainingOutcome(str(candidate), final_loss=final_loss), code


def claimed_nnodes(pipe: PipelineContext, state: PipelineState) -> int:
    """How many nodes the training claim for this generation asks to span (1 when alone)."""
    current = pipe.cluster.current if pipe.cluster is not None else None
    if current is None or current.generation != state.generation:
        return 1
    return max(1, int(current.claim.item.payload.get("nnodes", 1) or 1))


def rendezvous_record(state: PipelineState, item_id: str, master_addr: str, master_port: int,
                      nnodes: int, options: Mapping[str, float | int] | None = None) -> dict[str, Any]:
    """What the claimant gossips as `train_rendezvous` (see scheduling.RENDEZVOUS_KEYS); the
    quality loop's decided options, when any, as `train_options` for its joiners."""
    return {"generation": state.generation, "item_id": item_id, "master_addr": master_addr,
            "master_port": master_port, "nnodes": nnodes, "dataset_sha256": state.dataset_sha256,
            "parent_sha256": ps.parent(state)[1], "run_id": uuid.uuid4().hex,
            **({"train_options": dict(options)} if options else {})}


async def run_training(pipe: PipelineContext, state: PipelineState, ctx: DaemonContext,
                       resident: ResidentTrainer | None = None) -> TrainingOutcome:
    """`resident`: the daemon's trainer that stays between generations, when its workload's does."""
    Path(state.run_dir).mkdir(parents=True, exist_ok=True)
    nnodes = claimed_nnodes(pipe, state)
    ctx.log.info("training_started", generation=state.generation, run_dir=str(state.run_dir), nnodes=nnodes)
    cluster = pipe.cluster
    if nnodes > 1 and cluster is not None and cluster.current is not None:  # claimed_nnodes: both are
        if resident is not None:
            await resident.stop()  # a spanned run: the cores and memory are the run's
        host = cluster.node.addr.rsplit(":", 1)[0]
        return await train_spanned(pipe, state, ctx, nnodes, host, cluster.announce_rendezvous,
                                   cluster.current.claim.item.item_id)
    return (await _train(pipe, state, ctx, None, resident))[0]


async def train_spanned(pipe: PipelineContext, state: PipelineState, ctx: DaemonContext, nnodes: int,
                        master_addr: str, announce: Callable[[dict[str, Any] | None], None],
                        item_id: str) -> TrainingOutcome:
    """Node rank 0 of an `nnodes` run: announce the rendezvous, train, stop announcing; when the
    joiners never came, train alone (resuming the run dir's checkpoint, if any)."""
    timeout = float(pipe.settings.train.join_timeout_s)
    try:
        port = free_port(master_addr)
    except OSError as exc:  # the advertised host is not bindable here: nobody could join it
        ctx.log.warning("training_alone", generation=state.generation,
                        why=f"no port on {master_addr} for the rendezvous ({exc}): training on this node alone")
        return (await _train(pipe, state, ctx, None))[0]
    announce(rendezvous_record(state, item_id, master_addr, port, nnodes, train_options(pipe, state)))
    ctx.log.info("training_rendezvous", generation=state.generation, nnodes=nnodes,
                 master=f"{master_addr}:{port}", join_timeout_s=timeout)
    try:
        outcome, code = await _train(pipe, state, ctx, SpanArgs(nnodes, 0, master_addr, port, timeout))
    finally:
        announce(None)
    if code == JOIN_TIMEOUT_EXIT and not ctx.stopping.is_set():
        ctx.log.warning("training_alone", generation=state.generation,
                        why=f"{nnodes - 1} joiner(s) did not arrive within {timeout:.0f}s: training on this node alone")
        outcome, _ = await _train(pipe, state, ctx, None)
    return outcome
