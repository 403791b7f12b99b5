"""A bench that is told to stop (SIGTERM, as `timeout` or an operator's `kill` sends) takes the
loop it started down with it: the orchestrator runs in its own session, so before this it
was left running, orphaned, on the cores the next measurement needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.orchestrator_helpers import TINY_CONFIG


def processes_naming(text: str) -> list[int]:
    """Pids whose command line contains `text` (this test's data dir is unique to it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(entry.name) != os.getpid():
            pids.append(int(entry.name))
    return pids


def session_members(sid: int) -> list[int]:
    """Pids in session `sid`: the loop was started in a new session, so this is the orchestrator
    and everything it started (self-play workers, torchrun, the gauntlet)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid pgrp session
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@pytest.mark.timeout(240)
def test_sigterm_to_the_bench_stops_its_loop(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_CONFIG))
    data_dir = tmp_path / "loopdata"
    bench = subprocess.Popen(
        [sys.executable, "scripts/bench_learning.py", "--minutes", "10", "--config", str(config),
         "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--mcts-sims", "0", "--final-games", "0"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        # the orchestrator is up when its process names the data dir and it has written its log
        loop = wait_for(lambda: processes_naming(f"app.p2p_orchestrator --daemons {REPO / 'daemons.yaml'} --data-dir {data_dir} "),
                        90, "the loop's orchestrator to start")
        assert bench.poll() is None
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        [orchestrator] = loop
        wait_for(lambda: not session_members(orchestrator), 30, f"the loop's session {orchestrator} to end")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        for pid in processes_naming(str(data_dir)):
            os.killpg(pid, signal.SIGKILL)
