"""Launch a distributed job with torchrun and watch it: the Python face of `torchrun`.

    python -m app.shared.launcher --nproc 2 --log-dir runs/r1/logs [--nnodes 2 --node-rank 0
        --rdzv-endpoint host:29400] [--module app.games.train.train | --script job.py] -- ARGS...

torchrun (torch.distributed.run) starts the workers, sets RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT, and tears the group down when one worker fails. This layer adds
what a daemon needs around it: a free port when none is given, one log per rank at
`<log_dir>/rank_<r>.log` (JSON lines, echoed as `[Rank r] ...`, or as the JSON lines
themselves with `--log-format json`, as a daemon's `launcher.log` keeps them), the status of every rank while it runs,
a hard deadline on teardown (SIGTERM, then SIGKILL after `grace_s`, also of worker process
groups torchrun would leave behind if it died), and a `LaunchError` naming the rank that
failed first, its exit code and its last log lines. Each worker runs through
`app.shared.rank_entry`, which writes the rank's log, pid and exit record.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence, TextIO

from app.free_ports import free_port
from app.shared.json_lines import output_line
from app.shared.rank_entry import LOG_DIR_ENV
from app.shared.rank_watch import (
    LAST_LINES, LAUNCH_ID_ENV, RankStatus, RankWatch, first_failure, parse_torchrun_failures,
    prepare_log_dir, teardown,
)

# How often the launcher looks at its ranks while they run. Each look globs, tails and reads
# their records: at 0.1 s a launcher used ~5 % of a core over a whole run (a test suite of
# short runs on two cores felt it). A rank's exit time comes from its own record, not from
# when the launcher looked, so the first failure is still told apart exactly.
WATCH_POLL_S = 0.5

__all__ = ["JOIN_TIMEOUT_EXIT", "LaunchError", "LaunchResult", "LaunchSpec", "RankStatus", "RendezvousTimeout",
           "build_torchrun_argv", "first_failure", "launch", "main", "parse_torchrun_failures",
           "resolve_nproc"]

JOIN_TIMEOUT_EXIT = 3  # exit code of the CLI when the other nodes never joined the rendezvous
_JOIN_DEADLINE_MARGIN_S = 15.0  # our own deadline beyond torchrun's, should torchrun not give up


class LaunchError(RuntimeError):
    """A distributed run that failed; names the rank that failed first and shows its last lines."""

    def __init__(self, message: str, rank: int | None = None, exit_code: int | None = None,
                 last_lines: Sequence[str] = (), log_path: Path | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.exit_code = exit_code
        self.last_lines = list(last_lines)
        self.log_path = log_path


class RendezvousTimeout(LaunchError):
    """A multi-node run whose other nodes did not all arrive within `join_timeout_s`: no rank
    started here, so nothing was trained and the caller may run alone instead."""


@dataclass(frozen=True)
class LaunchSpec:
    """What to run and where. `target` is `["-m", module, *args]` or `[script, *args]`."""

    target: Sequence[str]
    nproc: int
    log_dir: Path
    nnodes: str = "1"  # "N" or "MIN:MAX"
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # a free one is chosen for single-node static runs
    rdzv_endpoint: str | None = None  # "host:port": use the c10d rendezvous (multi-node)
    rdzv_backend: str = "c10d"
    rdzv_id: str | None = None
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    grace_s: float = 5.0  # after the first failure (or on teardown): SIGTERM -> this -> SIGKILL
    status_every_s: float = 15.0  # 0 disables the periodic status line
    timeout_s: float | None = None
    echo: bool = True
    json_lines: bool = False  # echo JSON lines (app/shared/json_lines.py) instead of plain text
    # Multi-node static rendezvous: give up when not every node joined within this long.
    join_timeout_s: float | None = None


@dataclass(frozen=True)
class LaunchResult:
    log_dir: Path
    rank_logs: dict[int, Path]
    wall_s: float
    startup_s: float | None  # launch -> every local rank running the target
    ranks: list[RankStatus]


# ---- pure parts -----------------------------------------------------------------------------


def build_torchrun_argv(spec: LaunchSpec, port: int | None) -> list[str]:
    """The torchrun command line; multi-node options pass straight through."""
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(spec.nproc),
            "--nnodes", str(spec.nnodes), "--node-rank", str(spec.node_rank),
            "--max-restarts", str(spec.max_restarts), "--monitor-interval", "0.2"]
    if spec.rdzv_endpoint:
        argv += ["--rdzv-backend", spec.rdzv_backend, "--rdzv-endpoint", spec.rdzv_endpoint,
                 "--rdzv-id", spec.rdzv_id or "selfplay-mesh"]
    else:
        argv += ["--master-addr", spec.master_addr, "--master-port", str(port)]
        if spec.join_timeout_s and str(spec.nnodes) != "1":
            # The static rendezvous's TCPStore waits this long for the other nodes (rank 0) or
            # for rank 0's store to listen (the others), then torchrun fails.
            argv += ["--rdzv-conf", f"timeout={max(1, math.ceil(spec.join_timeout_s))}"]
    argv += ["-m", "app.shared.rank_entry", *spec.target]
    return argv



def launch(spec: LaunchSpec, out: TextIO | None = None,
           on_status: Callable[[list[RankStatus]], None] | None = None) -> LaunchResult:
    """Run `spec` under torchrun until every rank ends; LaunchError names the first failure."""
    if spec.nproc <= 0:
        raise LaunchError(f"nproc must be positive, got {spec.nproc}")
    out = out or sys.stdout
    log_dir = Path(spec.log_dir).resolve()
    spec = LaunchSpec(**{**vars(spec), "log_dir": log_dir})
    prepare_log_dir(log_dir)
    port = spec.master_port or (None if spec.rdzv_endpoint else free_port(spec.master_addr))
    launch_id = uuid.uuid4().hex
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **spec.env,
           LOG_DIR_ENV: str(log_dir), LAUNCH_ID_ENV: launch_id, "PYTHONUNBUFFERED": "1"}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    watch = RankWatch(log_dir, spec.nproc, spec.echo, out, on_status, spec.json_lines)
    argv = build_torchrun_argv(spec, port)
    where = f"rendezvous {spec.rdzv_endpoint}" if spec.rdzv_endpoint else f"store {spec.master_addr}:{port}"
    watch.say(f"[launcher] {spec.nproc} process(es) on node {spec.node_rank} of {spec.nnodes}, {where}, logs in {log_dir}")
    started = time.monotonic()
    t0 = time.time()
    torchrun_log = open(log_dir / "torchrun.log", "w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)

    def read_torchrun() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            torchrun_log.write(output_line(line, "torchrun") + "\n")
            torchrun_log.flush()
            watch.on_torchrun_line(line)

    reader = threading.Thread(target=read_torchrun, name="torchrun-output", daemon=True)
    reader.start()
    timed_out = False
    join_timed_out = False
    join_deadline = (spec.join_timeout_s + _JOIN_DEADLINE_MARGIN_S
                     if spec.join_timeout_s and str(spec.nnodes) != "1" and not spec.rdzv_endpoint else None)
    grace_used = False
    last_status = started
    try:
        while proc.poll() is None:
            watch.poll()
            now = time.monotonic()
            if watch.failure_seen_at is not None and now - watch.failure_seen_at > spec.grace_s:
                watch.say(f"[launcher] ranks still running {spec.grace_s:.0f}s after the first failure: killing them")
                grace_used = True
                break
            if spec.timeout_s is not None and now - started > spec.timeout_s:
                timed_out = True
                break
            if join_deadline is not None and not watch.ranks and now - started > join_deadline:
                join_timed_out = True
                break
            if spec.status_every_s and now - last_status >= spec.status_every_s:
                last_status = now
                watch.say(watch.status_line(now - started))
            try:  # back at once when torchrun ends
                proc.wait(timeout=WATCH_POLL_S)
            except subprocess.TimeoutExpired:
                pass
    finally:
        teardown(proc, watch, launch_id, 0.0 if grace_used else spec.grace_s)
        reader.join(timeout=5)
        torchrun_log.close()
        watch.settle()
        watch.flush_partial()
    summary = parse_torchrun_failures("\n".join(watch.torchrun_lines))
    for rank, code in summary.items():
        status = watch.ranks.setdefault(rank, RankStatus(rank))  # a rank may die before rank_entry runs
        if status.exit_code is None and code != 0:
            status.state, status.exit_code = "exited", code
    wall = time.monotonic() - started
    starts = [r.started_at for r in watch.ranks.values() if r.started_at is not None]
    startup = max(starts) - t0 if len(starts) == spec.nproc else None
    ranks = [watch.ranks[r] for r in sorted(watch.ranks)]
    if timed_out:
        raise LaunchError(f"run timed out after {spec.timeout_s:.0f}s; logs in {log_dir}")
    if join_deadline is not None and not ranks and (join_timed_out or proc.returncode != 0):
        tail = watch.torchrun_lines[-LAST_LINES:]
        raise RendezvousTimeout(
            f"not all {spec.nnodes} nodes joined the rendezvous at {spec.master_addr}:{port} within "
            f"{spec.join_timeout_s:.0f}s; no rank started; torchrun: " + " | ".join(tail[-2:]),
            None, proc.returncode, tail, log_dir / "torchrun.log")
    failed = first_failure(ranks)
    if failed is None and proc.returncode != 0:
        tail = watch.torchrun_lines[-LAST_LINES:]
        raise LaunchError(f"torchrun exited with code {proc.returncode} without a failed rank; last lines:\n"
                          + "\n".join(tail), None, proc.returncode, tail, log_dir / "torchrun.log")
    if failed is not None:
        lines = list(watch.tails[failed.rank])
        raise LaunchError(
            f"rank {failed.rank} failed first with exit code {failed.exit_code}; "
            f"last lines of {watch.log_path(failed.rank)}:\n" + "\n".join(lines[-15:]),
            failed.rank, failed.exit_code, lines, watch.log_path(failed.rank))
    return LaunchResult(log_dir, {r: watch.log_path(r) for r in watch.ranks}, wall, startup, ranks)


# ---- command line -----------------------------------------------------------------------------


def resolve_nproc(value: str | int) -> int:
    """Processes for this node: an explicit count, or for "auto"/0 one per visible GPU (the
    launcher's usual shape), and one process on a CPU-only machine."""
    if str(value) not in ("auto", "0"):
        return int(value)
    from app.shared.gpus import visible_gpus

    return visible_gpus() or 1


def parse_nproc(text: str) -> str | int:
    if text == "auto":
        return text
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--nproc must be a count or auto, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"--nproc must not be negative, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="app.shared.launcher", description="Run a job under torchrun and watch its ranks.")
    p.add_argument("--nproc", type=parse_nproc, default="auto",
                   help="processes on this node: N, or auto (default): one per visible GPU, 1 without a GPU")
    p.add_argument("--log-dir", type=Path, required=True)
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--master-addr", default="127.0.0.1")
    p.add_argument("--master-port", type=int)
    p.add_argument("--rdzv-endpoint", help="host:port of the c10d rendezvous (multi-node)")
    p.add_argument("--rdzv-backend", default="c10d")
    p.add_argument("--rdzv-id")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--grace-s", type=float, default=5.0)
    p.add_argument("--status-every", type=float, default=15.0)
    p.add_argument("--timeout-s", type=float)
    p.add_argument("--log-format", choices=("text", "json"), default="text",
                   help="what is printed: plain text for a terminal (default) or JSON lines with a timestamp")
    p.add_argument("--join-timeout-s", type=float,
                   help=f"multi-node: exit {JOIN_TIMEOUT_EXIT} when the other nodes did not join within this long")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--module", default="app.games.train.train", help="python module to run (default: the trainer)")
    group.add_argument("--script", type=Path, help="python script to run instead of a module")
    p.add_argument("args", nargs=argparse.REMAINDER, help="-- then the target's arguments")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target_args = args.args[1:] if args.args[:1] == ["--"] else args.args
    target = [str(args.script), *target_args] if args.script else ["-m", args.module, *target_args]
    spec = LaunchSpec(target=target, nproc=resolve_nproc(args.nproc), log_dir=args.log_dir, nnodes=args.nnodes,
                      node_rank=args.node_rank, master_addr=args.master_addr, master_port=args.master_port,
                      rdzv_endpoint=args.rdzv_endpoint, rdzv_backend=args.rdzv_backend, rdzv_id=args.rdzv_id,
                      max_restarts=args.max_restarts, grace_s=args.grace_s, status_every_s=args.status_every,
                      timeout_s=args.timeout_s, join_timeout_s=args.join_timeout_s,
                      json_lines=args.log_format == "json")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds through launch()'s teardown
    try:
        result = launch(spec)
    except LaunchError as exc:
        text = f"launch failed: {exc}"
        print(output_line(text, "launcher", stream="stderr") if spec.json_lines else text, file=sys.stderr, flush=True)
        return JOIN_TIMEOUT_EXIT if isinstance(exc, RendezvousTimeout) else 1
    text = f"all {len(result.ranks)} rank(s) finished in {result.wall_s:.1f}s"
    print(output_line(text, "launcher") if spec.json_lines else f"[launcher] {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
