"""scripts/local_cluster.py: starts N real nodes, reports a leader, and Ctrl-C stops them all."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.mesh_helpers import ROOT


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


@pytest.mark.timeout(60)
def test_local_cluster_elects_and_ctrl_c_stops_every_node(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "scripts/local_cluster.py", "--nodes", "3", "--profile", "fast", "--mesh-only",
         "--data-root", str(tmp_path), "--interval", "0.2"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    pids: list[int] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 40
        saw_leader = False
        while time.monotonic() < deadline and not saw_leader:
            line = proc.stdout.readline()
            if not line:
                break
            if m := re.match(r"started n\d pid=(\d+)", line):
                pids.append(int(m.group(1)))
            saw_leader = line.startswith("status") and "leader@" in line
        assert len(pids) == 3 and saw_leader
        os.kill(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "all nodes stopped" in out
        assert not [p for p in pids if alive(p)]
        assert all((tmp_path / f"n{i}" / "mesh_history.jsonl").exists() for i in range(3))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for pid in pids:
            if alive(pid):
                os.killpg(pid, signal.SIGKILL)
