"""A claimant whose joiners never come: its static rendezvous gives up after join_timeout_s,
it stops announcing the rendezvous, logs why, and trains the generation alone (real launcher,
real torchrun, real trainer)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry

from app.config import load_settings
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.metrics import Metrics
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.runner_settings import TrainSettings
from app.workloads import pipeline_context
from app.coordination.pipeline.training_job import train_spanned
from app.log import get_logger
from app.games.train.export import export_dataset
from app.coordination.pipeline.state import PipelineState, Stage
from app.games.train.train import RESULT_NAME
from tests.train_fixtures import make_db

pytestmark = pytest.mark.slow
JOIN_TIMEOUT_S = 3


def _pipe(tmp_path: Path) -> PipelineContext:
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "node": {"node_id": "claimant", "data_dir": str(tmp_path / "data")},
        "model": {"channels": 8, "blocks": 1},
        "train": {"batch_size": 32, "epochs": 1, "join_timeout_s": JOIN_TIMEOUT_S},
    }))
    return pipeline_context(load_settings(config), config_path=config)


def _ctx(pipe: PipelineContext) -> DaemonContext:
    metrics = Metrics(CollectorRegistry())
    return DaemonContext(name="train", settings=TrainSettings(), router=EventRouter(metrics=metrics), app_settings=pipe.settings,
                         stopping=asyncio.Event(), log=get_logger("test.train"), metrics=metrics)


@pytest.mark.timeout(120)
async def test_joiners_that_never_come_leave_the_claimant_training_alone(tmp_path: Path) -> None:
    pipe = _pipe(tmp_path)
    make_db(tmp_path / "games.db", 20)
    dataset = export_dataset([tmp_path / "games.db"], pipe.paths.datasets_dir / "gen_0001", augment=False)
    run_dir = pipe.paths.runs_dir / "gen_0001"
    state = PipelineState(generation=1, stage=Stage.TRAINING, dataset_dir=str(dataset.path),
                          dataset_sha256=dataset.dataset_sha256, run_dir=str(run_dir))
    announced: list[dict | None] = []
    started = time.monotonic()
    outcome = await train_spanned(pipe, state, _ctx(pipe), nnodes=2, master_addr="127.0.0.1",
                                  announce=announced.append, item_id="training:generation-1")
    wall = time.monotonic() - started

    assert outcome.error is None, outcome.error
    result = json.loads((run_dir / RESULT_NAME).read_text())
    assert result["world_size"] == 1 and Path(outcome.candidate_path).exists()
    # Announced once for two nodes, withdrawn before training alone.
    assert len(announced) == 2 and announced[1] is None
    rdzv = announced[0]
    assert rdzv is not None and rdzv["nnodes"] == 2 and rdzv["generation"] == 1
    assert rdzv["dataset_sha256"] == dataset.dataset_sha256 and rdzv["item_id"] == "training:generation-1"
    log = (run_dir / "launcher.log").read_text()
    assert "not all 2 nodes joined the rendezvous" in log and f"within {JOIN_TIMEOUT_S}s" in log
    records = [json.loads(line) for line in log.splitlines()]  # JSON lines, as every file the node writes
    assert all(r["timestamp"].endswith("Z") and r["source"] in ("launcher", "torchrun", "rank") for r in records)
    assert any(r["source"] == "rank" and r["rank"] == 0 and r.get("stream") for r in records)  # the lone run's rank
    assert wall >= JOIN_TIMEOUT_S  # it did wait for the joiners first


@pytest.mark.timeout(120)
async def test_a_stopped_joiner_tears_its_ranks_down(tmp_path: Path) -> None:
    """Node rank 1 joined a real run hosted by a rank-0 launcher; stopping its daemon ends every
    process of its side (launcher, torchrun, rank) promptly, mid-training."""
    import os
    import signal
    import subprocess
    import sys

    from app.coordination.pipeline.launcher_process import run_launcher
    from app.coordination.pipeline.training_job import SpanArgs, launcher_command
    from app.free_ports import free_port
    from tests.train_fixtures import kill_pids, live_pids_with_marker

    pipe = _pipe(tmp_path)
    make_db(tmp_path / "games.db", 20)
    dataset = export_dataset([tmp_path / "games.db"], tmp_path / "dataset", augment=False)
    port = free_port()
    host_dir = tmp_path / "host_run"
    host_dir.mkdir()
    with open(host_dir / "launcher.out", "w") as out:  # rank 0: trains "forever" (far more steps than the test waits)
        host = subprocess.Popen(
            [sys.executable, "-m", "app.shared.launcher", "--nproc", "1", "--nnodes", "2", "--node-rank", "0",
             "--master-port", str(port), "--join-timeout-s", "60", "--log-dir", str(host_dir / "logs"),
             "--", "--dataset", str(dataset.path), "--run-dir", str(host_dir), "--max-steps", "100000",
             "--epochs", "100000", "--channels", "8", "--blocks", "1", "--batch-size", "32"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    run_dir = pipe.paths.runs_dir / "join_gen_0001"
    ctx = _ctx(pipe)
    cmd = launcher_command(pipe, run_dir=run_dir, dataset_dir=dataset.path, generation=1, parent=None, nproc=1,
                           span=SpanArgs(2, 1, "127.0.0.1", port, 60))
    try:
        job = asyncio.ensure_future(run_launcher(cmd, run_dir, ctx))
        deadline = time.monotonic() + 60
        while not (run_dir / "logs" / "rank_1.pid").exists():  # joined, and its rank is training
            assert time.monotonic() < deadline and not job.done(), (run_dir / "launcher.log").read_text()
            await asyncio.sleep(0.2)
        assert live_pids_with_marker(str(run_dir))  # launcher, torchrun and the rank are running
        ctx.stopping.set()
        code = await asyncio.wait_for(job, 60)
        assert code == 143  # the launcher's own SIGTERM exit, not the SIGKILL after the daemon's grace
        deadline = time.monotonic() + 30
        while live_pids_with_marker(str(run_dir)):  # torchrun and the rank go down after the launcher
            assert time.monotonic() < deadline, live_pids_with_marker(str(run_dir))
            await asyncio.sleep(0.2)
    finally:
        kill_pids(live_pids_with_marker(str(run_dir)))
        os.killpg(host.pid, signal.SIGTERM)
        try:
            host.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(host.pid, signal.SIGKILL)
            host.wait()
        kill_pids(live_pids_with_marker(str(host_dir)))
