"""The node's worker processes in its /metrics: self-play workers, the shared network
process, torchrun and its ranks, gauntlet workers.

prometheus-client's ProcessCollector covers the orchestrator's own process only, and its
multiprocess mode would need every child to write metric files through the client; the
children are plain subprocesses (some not even Python of ours: torchrun), so this collector
reads them at scrape time from /proc: every descendant of the node's process, its CPU seconds
and resident memory, by a bounded kind (the module or program it runs). Nothing on a system
without /proc, never a made-up zero.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PROC = Path("/proc")
MAX_KINDS = 16  # bounded label values: further kinds are counted as "other"


def _ticks() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError):
        return 100.0


PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
TICKS = _ticks()


def _stat(pid: str) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds, resident bytes) of a process, None when it is gone."""
    try:
        fields = (PROC / pid / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS, int(fields[21]) * PAGE


def _kind(pid: str) -> str:
    """What a process runs: `python -m X` -> X, a script -> its name, else the program's."""
    try:
        argv = (PROC / pid / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return "other"
    args = [a.decode(errors="replace") for a in argv if a]
    if "-m" in args[:-1]:
        return args[args.index("-m") + 1]
    if "-c" in args:  # multiprocessing's spawned children: `python -c 'from multiprocessing...'`
        return "python-worker"
    scripts = [a for a in args[1:] if a.endswith(".py")]
    return Path(scripts[0]).name if scripts else (Path(args[0]).name if args else "other")


def descendants(root: int) -> list[str]:
    """Pids of every live process below `root`."""
    children: dict[int, list[str]] = defaultdict(list)
    for entry in PROC.glob("[0-9]*"):
        stat = _stat(entry.name)
        if stat is not None:
            children[stat[0]].append(entry.name)
    out, todo = [], [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            out.append(pid)
            todo.append(int(pid))
    return out


class WorkerCollector:
    """`mesh_worker_processes`, `mesh_worker_cpu_seconds_total` and
    `mesh_worker_resident_memory_bytes` by `kind`, read at each scrape. The CPU counter is the
    sum over the processes alive now, so it drops when a worker exits (as a process restart
    resets process_cpu_seconds_total); rate() handles that as a reset."""

    def __init__(self, namespace: str, root: int | None = None) -> None:
        self.namespace = namespace
        self.root = os.getpid() if root is None else root

    def collect(self) -> Iterable[object]:
        if not PROC.is_dir():
            return []
        n = self.namespace
        count = GaugeMetricFamily(f"{n}_worker_processes", "Processes below the node's process, by what they run.",
                                  labels=["kind"])
        cpu = CounterMetricFamily(f"{n}_worker_cpu_seconds", "CPU seconds of the node's live worker processes.",
                                  labels=["kind"])
        rss = GaugeMetricFamily(f"{n}_worker_resident_memory_bytes", "Resident memory of the node's worker processes.",
                                labels=["kind"])
        totals: dict[str, list[float]] = {}
        for pid in descendants(self.root):
            stat = _stat(pid)
            if stat is None:
                continue
            kind = _kind(pid)
            if kind not in totals and len(totals) >= MAX_KINDS:
                kind = "other"
            row = totals.setdefault(kind, [0, 0.0, 0])
            row[0] += 1
            row[1] += stat[1]
            row[2] += stat[2]
        for kind, (processes, seconds, resident) in sorted(totals.items()):
            count.add_metric([kind], processes)
            cpu.add_metric([kind], seconds)
            rss.add_metric([kind], resident)
        return [count, cpu, rss]
