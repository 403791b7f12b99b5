"""Training across two "nodes" on one CPU machine: two launchers joined by torchrun's static
multi-node rendezvous (node rank 0 hosts the store at its address and a free port), as a
multi-node training claim runs them on two machines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.games.train.export import export_dataset
from app.free_ports import free_port
from tests.train_fixtures import make_db

pytestmark = pytest.mark.slow


def _tail(path: Path, n: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-n:]) if path.exists() else "(none)"


@pytest.mark.timeout(240)
def test_two_launchers_rendezvous_and_train_as_one_job(tmp_path) -> None:
    make_db(tmp_path / "games.db", 40)
    dataset = tmp_path / "dataset"
    export_dataset([tmp_path / "games.db"], dataset, augment=False)
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        for node_rank in (0, 1):
            run_dir = tmp_path / f"node{node_rank}"
            run_dir.mkdir()
            with open(run_dir / "launcher.out", "w") as out:  # files, not pipes: nothing blocks on a full pipe
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "app.shared.launcher", "--nproc", "1", "--nnodes", "2",
                     "--node-rank", str(node_rank), "--master-addr", "127.0.0.1", "--master-port", str(port),
                     "--timeout-s", "150", "--log-dir", str(run_dir / "logs"), "--module", "app.games.train.train",
                     "--", "--dataset", str(dataset), "--run-dir", str(run_dir), "--max-steps", "6",
                     "--channels", "8", "--blocks", "1", "--batch-size", "32"],
                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 180
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    report = "\n".join(
        f"--- node {i}: launcher\n{_tail(tmp_path / f'node{i}' / 'launcher.out')}\n"
        f"--- node {i}: torchrun\n{_tail(tmp_path / f'node{i}' / 'logs' / 'torchrun.log')}"
        for i in (0, 1))
    assert [p.returncode for p in procs] == [0, 0], report
    # Node rank 0 holds global rank 0: it alone writes the result, having trained in a world of two.
    assert (tmp_path / "node0" / "result.json").exists(), report
    assert not (tmp_path / "node1" / "result.json").exists(), "only global rank 0 writes the result"
    result = json.loads((tmp_path / "node0" / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == 6
