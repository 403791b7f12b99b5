"""Runs one generation's training as a `torchrun` subprocess and reports how it ended.

The launcher runs in a child process (never in the event loop), so a training run can use
its cores and crash without touching the node. The child gets SIGTERM if this process dies
(Linux parent-death signal), and the launcher tears its ranks down on SIGTERM, so a
`kill -9` of the orchestrator leaves no training processes behind. Stopping the daemon
stops the run; its checkpoint stays in the run dir and the next start resumes it.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import signal
import sys
from dataclasses import dataclass
from pathlib import Path

from app.coordination.daemon_registry import DaemonContext
from app.coordination.pipeline_context import PipelineContext
from app.training.pipeline_state import PipelineState
from app.training.train import CANDIDATE_NAME, RESULT_NAME

_PR_SET_PDEATHSIG = 1
_STOP_GRACE_S = 20.0


@dataclass(frozen=True)
class TrainingOutcome:
    candidate_path: str
    final_loss: float | None = None
    error: str | None = None


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGTERM this child when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the orchestrator's own shutdown still stops the run


def training_command(pipe: PipelineContext, state: PipelineState, nproc: int) -> list[str]:
    run_dir = Path(state.run_dir)
    cmd = [sys.executable, "-m", "app.training.launcher", "--nproc", str(nproc),
           "--log-dir", str(run_dir / "logs"), "--module", "app.training.train", "--",
           "--dataset", str(state.dataset_dir), "--run-dir", str(run_dir), "--resume", "auto",
           "--generation", str(state.generation)]
    if pipe.config_path is not None:
        cmd += ["--config", str(pipe.config_path)]
    if state.best_path is not None:
        cmd += ["--parent", state.best_path]
    return cmd


async def run_training(pipe: PipelineContext, state: PipelineState, ctx: DaemonContext) -> TrainingOutcome:
    run_dir = Path(state.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    cmd = training_command(pipe, state, int(pipe.settings.train.nproc))
    ctx.log.info("training_started", generation=state.generation, run_dir=str(run_dir))
    with open(run_dir / "launcher.log", "ab") as log_file:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=log_file, stderr=asyncio.subprocess.STDOUT, preexec_fn=_die_with_parent)
        wait = asyncio.ensure_future(proc.wait())
        stop = asyncio.ensure_future(ctx.stopping.wait())
        try:
            while not wait.done():
                await asyncio.wait({wait, stop}, timeout=5.0, return_when=asyncio.FIRST_COMPLETED)
                ctx.mark_healthy()
                if stop.done() and not wait.done():
                    proc.send_signal(signal.SIGTERM)
                    try:
                        await asyncio.wait_for(asyncio.shield(wait), _STOP_GRACE_S)
                    except TimeoutError:
                        proc.kill()
                        await wait
        finally:
            stop.cancel()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    candidate = run_dir / CANDIDATE_NAME
    if proc.returncode != 0 or not candidate.exists():
        tail = (run_dir / "launcher.log").read_text(errors="replace")[-4000:]
        return TrainingOutcome(str(candidate), error=f"launcher exit code {proc.returncode}: {tail}")
    final_loss = None
    result_file = run_dir / RESULT_NAME
    if result_file.exists():
        result = json.loads(result_file.read_text())
        final_loss = result.get("best_holdout_loss")
    return TrainingOutcome(str(candidate), final_loss=final_loss)
