"""Runs first inside every worker torchrun starts, then hands over to the real target.

    python -m app.shared.rank_entry (-m MODULE | SCRIPT.py) [ARGS...]

It exists for the launcher's three needs that torchrun leaves open: (1) one log per global
rank, `<LAUNCH_LOG_DIR>/rank_<r>.log`, JSON lines as every file the node writes
(app/shared/json_lines.py): the target runs in a child process whose stdout and stderr are
pipes (C-level writes included), and this process writes each line as it arrives with its
time, rank and stream, so a crash of the target loses no line it wrote; (2) the worker's
pid, so the launcher can kill the worker's process group (torchrun puts each worker in its
own session; the child stays in it) even if torchrun itself dies; (3) the exit code and the
wall-clock time at which the target gave up, so the launcher can tell the rank that failed
first from the ranks that failed because it did (torchrun's own "root cause" has one-second
resolution and often names the wrong rank). Signals torchrun sends the worker are passed on
to the target, and the worker ends as the target did (its code, or its signal). Without
LAUNCH_LOG_DIR it simply runs the target.
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

from app.shared.json_lines import output_line

LOG_DIR_ENV = "LAUNCH_LOG_DIR"
TARGET_ENV = "RANK_ENTRY_TARGET"  # set in the child that runs the target
DRAIN_AFTER_EXIT_S = 1.0  # output still read after the target exited (a grandchild may hold the pipes)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _relay(argv: list[str], log_path: Path, rank: int) -> int:
    """Run the target in a child and write its output to `log_path` as JSON lines; the
    child's return code (negative: the signal it died of)."""
    proc = subprocess.Popen([sys.executable, "-m", "app.shared.rank_entry", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, TARGET_ENV: "1"})
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, lambda signum, _frame: proc.send_signal(signum))
    streams = {proc.stdout: "stdout", proc.stderr: "stderr"}
    partial = {name: b"" for name in streams.values()}
    selector = selectors.DefaultSelector()
    for pipe in streams:
        selector.register(pipe, selectors.EVENT_READ)
    exited_at = None
    with open(log_path, "a", encoding="utf-8") as out:
        def write(name: str, raw: bytes) -> None:
            out.write(output_line(raw.decode("utf-8", "replace").rstrip("\r"), "rank", rank=rank, stream=name) + "\n")

        while selector.get_map():
            if exited_at is None and proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and time.monotonic() - exited_at > DRAIN_AFTER_EXIT_S:
                break
            for key, _ in selector.select(timeout=0.2):
                name = streams[key.fileobj]  # type: ignore[index]
                data = os.read(key.fileobj.fileno(), 65536)  # type: ignore[union-attr]
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                lines = (partial[name] + data).split(b"\n")
                partial[name] = lines.pop()
                for raw in lines:
                    write(name, raw)
            out.flush()
        for name, rest in partial.items():
            if rest:
                write(name, rest)
    return proc.wait()


def _end_as(code: int) -> None:
    """Leave as the target did: its exit code, or the signal that killed it (torchrun and the
    launcher read a death by SIGTERM as a consequence, not a cause)."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def _run_target(argv: list[str]) -> tuple[int, str | None]:
    """(exit code, error summary) of the target, run as `python -m`/`python script` would."""
    if not argv:
        print("rank_entry: no target given (expected -m MODULE or SCRIPT)", file=sys.stderr)
        return 2, "no target"
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                print("rank_entry: -m needs a module name", file=sys.stderr)
                return 2, "no module"
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exc:
        if exc.code is None:
            return 0, None
        if isinstance(exc.code, int):
            return exc.code, None if exc.code == 0 else f"exit status {exc.code}"
        print(exc.code, file=sys.stderr)
        return 1, str(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130, "KeyboardInterrupt"
    except BaseException as exc:  # the target failed: report it like Python would, keep the time
        traceback.print_exc()
        return 1, f"{type(exc).__name__}: {exc}"
    return 0, None


def main() -> None:
    argv = sys.argv[1:]
    log_dir = os.environ.get(LOG_DIR_ENV)
    if not log_dir:
        sys.exit(_run_target(argv)[0])
    rank = int(os.environ.get("RANK", "0"))
    directory = Path(log_dir)
    if not os.environ.get(TARGET_ENV):  # the worker torchrun started: relay the target's output
        _write_json(directory / f"rank_{rank}.pid", {
            "pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time(),
            "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        })
        _end_as(_relay(argv, directory / f"rank_{rank}.log", rank))
    os.environ.pop(TARGET_ENV)  # what the target starts is not a rank_entry child
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # pipes: a line at a time
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    code, error = _run_target(argv)
    _write_json(directory / f"rank_{rank}.exit.json", {"exit_code": code, "at": time.time(), "error": error})
    sys.stdout.flush()
    sys.stderr.flush()
    # Past this point there is nothing left to write (rank 0's files are atomic and fsynced),
    # and interpreter finalization is where torch's C++ teardown sometimes aborted a finished
    # rank ("terminate called without an active exception", SIGABRT after exit.json said 0),
    # failing a run that had succeeded. So leave without it.
    os._exit(code)


if __name__ == "__main__":
    main()
