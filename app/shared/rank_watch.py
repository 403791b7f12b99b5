"""Watching the ranks of one torchrun job: their logs, pids, exits, and the teardown.

Everything here reads what `app.shared.rank_entry` writes into the log directory
(`rank_<r>.log` JSON lines, `rank_<r>.pid`, `rank_<r>.exit.json`) and what torchrun prints, and
decides which rank failed first. What it echoes is plain text for a terminal (`[Rank r] ...`)
or, with `json_lines`, the one JSON line format of every file the node writes
(app/shared/json_lines.py: a daemon's `launcher.log`). Split from launcher.py so that file is
only about starting torchrun.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence, TextIO

from app.shared.json_lines import output_line, parse_line

LAUNCH_ID_ENV = "LAUNCH_ID"
POLL_S = 0.1
LAST_LINES = 30
_FAILED_LINE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_SUMMARY_BLOCK = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*(\d+)\)\s*\n\s*exitcode\s*:\s*(-?\d+)")


@dataclass
class RankStatus:
    rank: int
    state: str = "pending"  # pending | running | exited
    pid: int | None = None
    exit_code: int | None = None
    started_at: float | None = None
    ended_at: float | None = None  # precise when the rank wrote its exit record, else observed
    last_line: str = ""

    def describe(self) -> str:
        if self.state == "exited":
            return f"rank {self.rank} exited {self.exit_code if self.exit_code is not None else '?'}"
        if self.state == "running":
            return f"rank {self.rank} running (pid {self.pid}) {self.last_line[-60:]!r}"
        return f"rank {self.rank} pending"



def parse_torchrun_failures(text: str) -> dict[int, int]:
    """{global rank: exit code} from torchrun's failure summary."""
    return {int(rank): int(code) for rank, _local, code in _SUMMARY_BLOCK.findall(text)}


def first_failure(ranks: Sequence[RankStatus]) -> RankStatus | None:
    """The rank that failed first: the earliest end among non-zero exits, preferring ranks that
    did not die of the SIGTERM a teardown sends (those are consequences, not causes)."""
    failed = [r for r in ranks if r.state == "exited" and r.exit_code != 0]
    causes = ([r for r in failed if r.exit_code not in (None, -signal.SIGTERM)]
              or [r for r in failed if r.exit_code is not None] or failed)
    if not causes:
        return None
    return min(causes, key=lambda r: (r.ended_at if r.ended_at is not None else float("inf"), r.rank))




def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        try:
            os.kill(pid, 0)
            return not os.path.isdir("/proc")
        except OSError:
            return False


def _pids_with_env(marker: str) -> list[int]:
    """Every process whose environment carries our launch id: workers and what they started."""
    needle = marker.encode()
    found = []
    if not os.path.isdir("/proc"):
        return found
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as fh:
                    if needle in fh.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


class RankWatch:
    """State of one launch while it runs: rank logs tailed, pid and exit records read."""

    def __init__(self, log_dir: Path, nproc: int, echo: bool, out: TextIO,
                 on_status: Callable[[list[RankStatus]], None] | None, json_lines: bool = False) -> None:
        self.log_dir = log_dir
        self.json_lines = json_lines
        self.nproc = nproc
        self.echo = echo
        self.out = out
        self.on_status = on_status
        # Global ranks are discovered from the records rank_entry writes: with an elastic
        # rendezvous, the ranks a node gets are decided at run time, not by --node-rank.
        self.ranks: dict[int, RankStatus] = {}
        self.offsets: dict[int, int] = collections.defaultdict(int)
        self.partial: dict[int, bytes] = collections.defaultdict(bytes)
        self.tails: dict[int, collections.deque] = collections.defaultdict(lambda: collections.deque(maxlen=LAST_LINES))
        self.pgids: set[int] = set()
        self.torchrun_lines: list[str] = []
        self.failure_seen_at: float | None = None

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"rank_{rank}.log"

    def say(self, text: str) -> None:
        """The launcher's own line ('[launcher] ...')."""
        if self.echo:
            line = output_line(text.removeprefix("[launcher] "), "launcher") if self.json_lines else text
            print(line, file=self.out, flush=True)

    def _echo(self, rank: int, text: str, raw: str) -> None:
        """A rank's line: as the rank wrote it (a JSON line) or `[Rank r] text` on a terminal."""
        if self.echo:
            if self.json_lines:
                line = raw if parse_line(raw) is not None else output_line(raw, "rank", rank=rank)
            else:
                line = f"[Rank {rank}] {text}"
            print(line, file=self.out, flush=True)

    def changed(self) -> None:
        if self.on_status is not None:
            self.on_status([RankStatus(**vars(r)) for r in self.ranks.values()])

    def discover(self) -> None:
        for path in self.log_dir.glob("rank_*.pid"):
            rank = int(path.name[len("rank_"):-len(".pid")])
            if rank not in self.ranks:
                self.ranks[rank] = RankStatus(rank)

    def poll(self) -> None:
        self.discover()
        for rank, status in sorted(self.ranks.items()):
            self._tail(rank)
            if status.state == "pending":
                info = _read_json(self.log_dir / f"rank_{rank}.pid")
                if info:
                    status.state, status.pid, status.started_at = "running", int(info["pid"]), float(info["started_at"])
                    self.pgids.add(int(info["pgid"]))
                    self.say(f"[launcher] rank {rank} started (pid {status.pid})")
                    self.changed()
            if status.state == "running":
                record = _read_json(self.log_dir / f"rank_{rank}.exit.json")
                if record is not None:
                    self._ended(status, int(record["exit_code"]), float(record["at"]))
                elif status.pid is not None and not _alive(status.pid):
                    record = _read_json(self.log_dir / f"rank_{rank}.exit.json")  # written just before exit
                    if record is not None:
                        self._ended(status, int(record["exit_code"]), float(record["at"]))
                    else:
                        self._ended(status, None, time.time() - POLL_S)

    def settle(self, timeout_s: float = 5.0) -> None:
        """Poll until no rank still looks running, for at most `timeout_s`: after teardown's
        SIGKILL a rank takes a moment to die, and the last status (and the summary) should show
        every rank ended rather than the instant before."""
        deadline = time.monotonic() + timeout_s
        self.poll()
        while any(r.state == "running" for r in self.ranks.values()) and time.monotonic() < deadline:
            time.sleep(POLL_S)
            self.poll()

    def _ended(self, status: RankStatus, code: int | None, at: float) -> None:
        status.state, status.exit_code, status.ended_at = "exited", code, at
        self._tail(status.rank)
        self.say(f"[launcher] rank {status.rank} exited with code {code if code is not None else '?'}")
        if code != 0 and self.failure_seen_at is None:
            self.failure_seen_at = time.monotonic()
        self.changed()

    def _tail(self, rank: int) -> None:
        path = self.log_path(rank)
        try:
            with open(path, "rb") as fh:
                fh.seek(self.offsets[rank])
                data = fh.read()
        except OSError:
            return
        if not data:
            return
        self.offsets[rank] += len(data)
        lines = (self.partial[rank] + data).split(b"\n")
        self.partial[rank] = lines.pop()
        for raw in lines:
            self._line(rank, raw.decode("utf-8", "replace").rstrip("\r"))

    def _line(self, rank: int, raw: str) -> None:
        record = parse_line(raw)
        text = raw if record is None else str(record["event"])
        self.tails[rank].append(text)
        self.ranks[rank].last_line = text
        self._echo(rank, text, raw)

    def flush_partial(self) -> None:
        for rank, rest in self.partial.items():
            if rest:
                self._line(rank, rest.decode("utf-8", "replace"))
        self.partial.clear()

    def on_torchrun_line(self, line: str) -> None:
        self.torchrun_lines.append(line)
        if _FAILED_LINE.search(line) and self.failure_seen_at is None:
            self.failure_seen_at = time.monotonic()
        if self.echo:
            print(output_line(line, "torchrun") if self.json_lines else f"[torchrun] {line}", file=self.out, flush=True)

    def status_line(self, elapsed: float) -> str:
        waiting = self.nproc - len(self.ranks)
        parts = [r.describe() for _, r in sorted(self.ranks.items())]
        if waiting > 0:
            parts.append(f"{waiting} rank(s) not started")
        return f"[launcher] {elapsed:.0f}s: " + " | ".join(parts)


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def prepare_log_dir(log_dir: Path) -> None:
    log_dir.mkdir(parents=True, exist_ok=True)
    for pattern in ("rank_*.log", "rank_*.pid", "rank_*.exit.json", "torchrun.log"):
        for stale in log_dir.glob(pattern):
            stale.unlink(missing_ok=True)


def teardown(proc: subprocess.Popen, watch: RankWatch, launch_id: str, grace_s: float) -> None:
    """SIGTERM torchrun's group and every worker group, SIGKILL whatever outlives `grace_s`
    (at once when `grace_s` is 0: the grace after a failure has already been given)."""
    groups = {proc.pid, *watch.pgids}
    stragglers = [p for p in _pids_with_env(f"{LAUNCH_ID_ENV}={launch_id}") if _alive(p)]
    if proc.poll() is None or stragglers or any(_group_alive(g) for g in groups):
        for g in groups:
            _signal_group(g, signal.SIGTERM)
        for pid in stragglers:
            _kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s  # grace_s 0: straight to SIGKILL
        while time.monotonic() < deadline and (proc.poll() is None or any(_group_alive(g) for g in groups)):
            time.sleep(0.05)
        for g in groups:
            _signal_group(g, signal.SIGKILL)
        for pid in _pids_with_env(f"{LAUNCH_ID_ENV}={launch_id}"):
            _kill(pid, signal.SIGKILL)
    try:
        proc.wait(timeout=max(grace_s, 2.0))
    except subprocess.TimeoutExpired:
        _signal_group(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except OSError:
        return False


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except OSError:
        pass

