"""Runs first inside every worker torchrun starts, then hands over to the real target.

    python -m app.shared.rank_entry (-m MODULE | SCRIPT.py) [ARGS...]

It exists for the launcher's three needs that torchrun leaves open: (1) one log per global
rank, `<LAUNCH_LOG_DIR>/rank_<r>.log`, with stdout and stderr (C-level writes included)
interleaved in the order they happened; (2) the worker's pid, so the launcher can kill the
worker's process group (torchrun puts each worker in its own session) even if torchrun
itself dies; (3) the exit code and the wall-clock time at which the target gave up, so the
launcher can tell the rank that failed first from the ranks that failed because it did
(torchrun's own "root cause" has one-second resolution and often names the wrong rank).
Without LAUNCH_LOG_DIR it simply runs the target.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

LOG_DIR_ENV = "LAUNCH_LOG_DIR"


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _redirect_output(log_path: Path) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    sys.stderr.reconfigure(line_buffering=True)  # type: ignore[union-attr]


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
    _redirect_output(directory / f"rank_{rank}.log")
    _write_json(directory / f"rank_{rank}.pid", {
        "pid": os.getpid(), "pgid": os.getpgid(0), "started_at": time.time(),
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")), "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
    })
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
