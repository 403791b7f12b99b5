"""A bench that is told to stop (SIGTERM, as `timeout` or an operator's `kill` sends) takes the
loop it started down with it: the orchestrator runs in its own session, so before this it
was left running, orphaned, on the cores the next measurement needed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO
from tests.orchestrator_helpers import TINY_CONFIG, group_alive, wait_until
from tests.train_fixtures import live_pids_with_marker


@pytest.mark.timeout(240)
def test_sigterm_to_the_bench_stops_its_loop(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(TINY_CONFIG))
    data_dir = tmp_path / "loopdata"
    bench = subprocess.Popen(
        [sys.executable, "scripts/bench_learning.py", "--minutes", "10", "--config", str(config),
         "--data-dir", str(data_dir), "--out", str(tmp_path / "out"), "--mcts-sims", "0", "--final-games", "0"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # the loop's orchestrator, not the bench (whose command line names the data dir too);
    # /proc's command lines separate the arguments with NULs
    marker = "\0".join(["app.p2p_orchestrator", "--daemons", str(REPO / "daemons.yaml"), "--data-dir", str(data_dir), ""])
    try:
        loop = wait_until(lambda: live_pids_with_marker(marker), 90, what="the loop's orchestrator to start")
        assert bench.poll() is None
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=120) == 128 + signal.SIGTERM
        # the loop was started in a new session: its process group is the orchestrator and
        # everything it started (self-play workers, torchrun, the gauntlet)
        [orchestrator] = loop
        wait_until(lambda: not group_alive(orchestrator), 30, what=f"the loop's process group {orchestrator} to end")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait(timeout=10)
        for pid in live_pids_with_marker(marker):
            os.killpg(pid, signal.SIGKILL)
