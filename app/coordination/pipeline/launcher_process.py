"""A training launcher as a child of the node: started, watched, stopped, its output logged.

The launcher runs in a child process (never in the event loop), so a training run can use its
cores and crash without touching the node. The child gets SIGTERM if this process dies (Linux
parent-death signal), and the launcher tears its ranks down on SIGTERM, so a `kill -9` of the
orchestrator leaves no training processes behind. Its output goes to a run dir's
`launcher.log` as JSON lines; a trainer that stays for several generations
(resident_trainer.py) writes each generation's part into that generation's run dir.
"""

from __future__ import annotations

import asyncio
import ctypes
import signal
from collections.abc import Callable
from pathlib import Path
from typing import IO

from app.coordination.daemons.daemon_registry import DaemonContext
from app.shared.json_lines import output_line, parse_line, text_of

_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 20.0


def _die_with_parent() -> None:
    """preexec_fn: ask the kernel to SIGTERM this child when its parent dies."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass  # not Linux: the orchestrator's own shutdown still stops the run


class LaunchLog:
    """Where the launcher's lines go: one run dir's launcher.log, switched to the next run dir
    when a trainer that stays is handed its next generation."""

    def __init__(self, path: Path) -> None:
        self._file: IO[str] = self._open(path)

    @staticmethod
    def _open(path: Path) -> IO[str]:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a", encoding="utf-8")

    def write(self, line: str) -> None:
        self._file.write(line + "\n")
        self._file.flush()

    def switch(self, path: Path) -> None:
        self._file.close()
        self._file = self._open(path)

    def close(self) -> None:
        self._file.close()


async def _copy_as_json_lines(stream: asyncio.StreamReader, log: LaunchLog) -> None:
    """The launcher's output into the log: its JSON lines as they are, any other line (a
    traceback of the launcher itself, an argument error) wrapped as one."""
    while line := await stream.readline():
        text = line.decode("utf-8", "replace").rstrip("\r\n")
        log.write(text if parse_line(text) is not None else output_line(text, "launcher"))


class Launched:
    """A running launcher, its log and the task copying its output there."""

    def __init__(self, proc: asyncio.subprocess.Process, log: LaunchLog) -> None:
        self.proc = proc
        self.log = log
        assert proc.stdout is not None
        self._copy = asyncio.ensure_future(_copy_as_json_lines(proc.stdout, log))

    @property
    def running(self) -> bool:
        return self.proc.returncode is None

    async def wait(self, ctx: DaemonContext, done: Callable[[], bool] | None = None) -> int | None:
        """Until it exits (its exit code), the daemon stops (it is stopped: SIGTERM, then
        SIGKILL after a grace) or `done()` turns true while it runs (None: it goes on)."""
        wait = asyncio.ensure_future(self.proc.wait())
        stop = asyncio.ensure_future(ctx.stopping.wait())
        try:
            while not wait.done():
                await asyncio.wait({wait, stop}, timeout=5.0 if done is None else 0.5,
                                   return_when=asyncio.FIRST_COMPLETED)
                ctx.mark_healthy()
                if stop.done() and not wait.done():
                    await self.stop()
                elif done is not None and not wait.done() and done():
                    return None
        finally:
            stop.cancel()
            if not wait.done():
                wait.cancel()
        return self.proc.returncode

    async def stop(self) -> None:
        """SIGTERM (the launcher tears its ranks down), SIGKILL after a grace."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), STOP_GRACE_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()

    async def close(self) -> None:
        """Stopped if it still runs; the rest of its output logged (ranks' children may hold
        the pipe: bounded)."""
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        try:
            await asyncio.wait_for(self._copy, 5.0)
        except (TimeoutError, ValueError):
            self._copy.cancel()
        self.log.close()


async def launch(cmd: list[str], log_path: Path) -> Launched:
    proc = await asyncio.create_subprocess_exec(
        *cmd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, preexec_fn=_die_with_parent,
        limit=1 << 20)
    return Launched(proc, LaunchLog(log_path))


async def run_launcher(cmd: list[str], run_dir: Path, ctx: DaemonContext) -> int:
    """Run the launcher until it ends or the daemon stops; its output is appended to
    `<run_dir>/launcher.log` as JSON lines. Returns its exit code."""
    launched = await launch(cmd, run_dir / "launcher.log")
    try:
        code = await launched.wait(ctx)
    finally:
        await launched.close()
    assert code is not None and launched.proc.returncode is not None
    return launched.proc.returncode


def launcher_log_tail(run_dir: Path, n: int = 4000) -> str:
    """The last `n` characters of what launcher.log says, as text (one line per JSON line)."""
    path = run_dir / "launcher.log"
    if not path.exists():
        return ""
    return "\n".join(text_of(line) for line in path.read_text(errors="replace")[-4 * n:].splitlines())[-n:]
