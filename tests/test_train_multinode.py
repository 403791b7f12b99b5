"""Training across two "nodes" on one CPU machine: two launchers joined by torchrun's c10d
rendezvous, as a multi-node training claim would run them on two machines."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from app.training.export import export_dataset
from app.training.launcher import free_port
from tests.train_fixtures import make_db

pytestmark = pytest.mark.slow


@pytest.mark.timeout(240)
def test_two_launchers_rendezvous_and_train_as_one_job(tmp_path) -> None:
    make_db(tmp_path / "games.db", 40)
    dataset = tmp_path / "dataset"
    export_dataset([tmp_path / "games.db"], dataset, augment=False)
    endpoint = f"127.0.0.1:{free_port()}"
    procs = []
    try:
        for node_rank in (0, 1):
            run_dir = tmp_path / f"node{node_rank}"
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "app.training.launcher", "--nproc", "1", "--nnodes", "2",
                 "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
                 "--log-dir", str(run_dir / "logs"), "--module", "app.training.train", "--",
                 "--dataset", str(dataset), "--run-dir", str(run_dir), "--max-steps", "6",
                 "--channels", "8", "--blocks", "1", "--batch-size", "32"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True))
        outputs = [p.communicate(timeout=200)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    # Global rank 0 (on whichever node) wrote the one result; it saw a world of two processes.
    results = [json.loads((tmp_path / f"node{i}" / "result.json").read_text())
               for i in (0, 1) if (tmp_path / f"node{i}" / "result.json").exists()]
    assert len(results) == 1, "exactly one node's rank 0 writes the result"
    assert results[0]["world_size"] == 2 and results[0]["steps"] == 6
