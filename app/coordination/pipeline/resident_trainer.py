"""The node's side of a trainer that stays (app/shared/trainer_follow.py).

On a lone-run generation of a workload whose trainer takes a follow file (`TrainingJob.
follow_flag`, the LM workload), the train daemon launches the trainer with one and keeps the
launcher running after the generation's candidate is written. The next generation is handed
to it, not launched, when it is still running, was launched with the same command but for the
per-generation arguments (so the quality loop's options and the config are its own), and the
generation's parent is the candidate it wrote last (the trainer's head or a promoted one: its
weights and optimizer are in memory). Otherwise it is stopped and a fresh launcher starts,
which continues from the checkpoints as before (`--continue-from`).

A handed-over generation ends like a launched one: its candidate and result.json in its run
dir. If the trainer exits first, a clean exit means it declined (its line in launcher.log says
why) and the generation is launched fresh at once; any other exit is the run's failure, as a
launched run's would be, and the daemon's retry launches fresh, resuming the run dir's
checkpoint. The trainer is stopped when the daemon stops.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.pipeline.launcher_process import Launched, launch
from app.coordination.pipeline.steps import TrainingJob
from app.shared.json_lines import output_line
from app.shared.trainer_follow import FollowRequest, write_request

FOLLOW_NAME = "follow.json"  # in the run dir a trainer was launched for: where its next generations come
# the per-generation arguments of a launch (launcher's and trainer's, launcher_command); the rest
# must match to hand over
PER_GENERATION = ("--log-dir", "--dataset", "--run-dir", "--generation", "--parent")


def launch_key(cmd: list[str], job: TrainingJob) -> tuple[str, ...]:
    """The launch command without its per-generation arguments and their values."""
    per_generation = {*PER_GENERATION, job.continue_flag, job.follow_flag} - {None}
    key: list[str] = []
    skip = False
    for part in cmd:
        if skip:
            skip = False
        elif part in per_generation:
            skip = True
        else:
            key.append(part)
    return tuple(key)


def finished_run(run_dir: Path, candidate_name: str, result_name: str, generation: int) -> bool:
    """The run dir holds this generation's candidate (renamed into place after result.json)."""
    try:
        result = json.loads((run_dir / result_name).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(result, dict) and result.get("generation") == generation and (run_dir / candidate_name).is_dir()


class ResidentTrainer:
    """The launcher that may take the next generation, and what it was launched as."""

    def __init__(self, job: TrainingJob) -> None:
        assert job.follow_flag is not None, "a trainer stays only when it takes a follow file"
        self.job = job
        self.candidate_name, self.result_name = job.candidate_name, job.result_name
        self.launched: Launched | None = None
        self.key: tuple[str, ...] = ()
        self.follow_file: Path | None = None
        self.candidate_sha256: str | None = None  # of the generation it trained last

    def can_take(self, cmd: list[str], parent_sha256: str | None) -> bool:
        return (self.launched is not None and self.launched.running and launch_key(cmd, self.job) == self.key
                and parent_sha256 is not None and parent_sha256 == self.candidate_sha256)

    async def train(self, cmd: list[str], run_dir: Path, generation: int, dataset: str,
                    parent: tuple[str | None, str | None], ctx: DaemonContext) -> int:
        """This generation, handed over or launched with a follow file; the launcher's exit code,
        or 0 when the generation is done and the trainer stays."""
        if self.can_take(cmd, parent[1]):
            code = await self._hand_over(run_dir, generation, dataset, parent, ctx)
            if code is not None:
                return code
        await self.stop()
        follow = run_dir / FOLLOW_NAME
        follow.unlink(missing_ok=True)  # a request left from before is never this launch's
        launched = await launch([*cmd, str(self.job.follow_flag), str(follow)], run_dir / "launcher.log")
        self.launched, self.key, self.follow_file, self.candidate_sha256 = launched, launch_key(cmd, self.job), follow, None
        return await self._until_done(run_dir, generation, ctx)

    async def _hand_over(self, run_dir: Path, generation: int, dataset: str,
                         parent: tuple[str | None, str | None], ctx: DaemonContext) -> int | None:
        """None when the trainer declined (a clean exit without the candidate): launch fresh."""
        assert self.launched is not None and self.follow_file is not None and parent[0] and parent[1]
        self.launched.log.switch(run_dir / "launcher.log")
        self.launched.log.write(output_line(
            f"generation {generation} handed to the running trainer (launcher pid {self.launched.proc.pid}), "
            f"parent {parent[1][:12]}: no launch", "node"))
        write_request(self.follow_file, FollowRequest(generation, str(run_dir), dataset, parent[0], parent[1]))
        code = await self._until_done(run_dir, generation, ctx)
        if code == 0 and not finished_run(run_dir, self.candidate_name, self.result_name, generation) \
                and not ctx.stopping.is_set():
            ctx.log.info("trainer_declined", generation=generation,
                         why="the running trainer exited without the generation (its reason in launcher.log)")
            return None
        return code

    async def _until_done(self, run_dir: Path, generation: int, ctx: DaemonContext) -> int:
        assert self.launched is not None
        started = time.monotonic()
        code = await self.launched.wait(
            ctx, lambda: finished_run(run_dir, self.candidate_name, self.result_name, generation))
        if code is None:
            result = json.loads((run_dir / self.result_name).read_text(encoding="utf-8"))
            if result.get("trainer_stays") is True:  # done, and it waits for the next generation
                self.candidate_sha256 = result.get("candidate_sha256")
                ctx.log.info("trainer_stays", generation=generation, wall_s=round(time.monotonic() - started, 1))
                return 0
            code = await self.launched.wait(ctx)  # done, and it ends: its exit code is the run's
        await self.close()
        assert code is not None
        return code

    async def stop(self) -> None:
        """Stopped (SIGTERM, then SIGKILL after a grace) and forgotten."""
        if self.launched is not None:
            await self.launched.stop()
        await self.close()

    async def close(self) -> None:
        if self.launched is not None:
            await self.launched.close()
        self.launched, self.key, self.follow_file, self.candidate_sha256 = None, (), None, None
