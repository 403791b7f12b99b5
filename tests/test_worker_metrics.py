"""The node's worker processes in /metrics: a child running `python -m X` (as self-play,
training and the gauntlet run) is counted by its kind with its CPU and resident memory, and
is gone from the exposition once it exits."""

from __future__ import annotations

import subprocess
import sys
import time

from app.coordination.daemons.metrics import Metrics


def _samples(metrics: Metrics, name: str) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line.startswith(name + "{"):
            labels, value = line.rsplit(" ", 1)
            kind = labels.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(value)
    return out


def test_worker_processes_are_counted_by_kind_with_memory_and_cpu() -> None:
    metrics = Metrics(node="n1")
    child = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while "http.server" not in _samples(metrics, "mesh_worker_processes") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _samples(metrics, "mesh_worker_processes")["http.server"] == 1
        assert _samples(metrics, "mesh_worker_resident_memory_bytes")["http.server"] > 1_000_000
        assert _samples(metrics, "mesh_worker_cpu_seconds_total")["http.server"] >= 0
        assert 'node="n1"' in next(ln for ln in metrics.render().decode().splitlines()
                                   if ln.startswith("mesh_worker_processes{"))
    finally:
        child.kill()
        child.wait(10)
    assert "http.server" not in _samples(metrics, "mesh_worker_processes")
