"""The real orchestrator process on one node: a promoted generation, a clean SIGTERM, and a
kill -9 mid-training that a restart completes without losing or duplicating games."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from app.db.registry import ModelRegistry
from app.training.dataset import dataset_sha256
from app.db.replay_db import ReplayDB
from tests.orchestrator_helpers import (
    group_alive, kill_group, start_node, tail, wait_until, write_node_files,
)

pytestmark = pytest.mark.slow


@pytest.mark.timeout(420)
def test_kill_9_mid_training_then_restart_completes_the_generation(tmp_path) -> None:
    files = write_node_files(tmp_path / "node")
    proc = start_node(files, "--max-generations", "1")
    try:
        wait_until(lambda: files.state().get("stage") == "training", 240, what="stage training")
        with ReplayDB(files.data_dir / "games.db") as db:
            before = set(db.uids())
        os.kill(proc.pid, signal.SIGKILL)  # the orchestrator alone: its children must follow
        proc.wait(timeout=10)
        wait_until(lambda: not group_alive(proc.pid), 30, what="no process left of the killed node")
    finally:
        kill_group(proc)
    assert before, "self-play should have stored games before training started"
    killed_state = files.state()
    assert killed_state["stage"] == "training" and killed_state["generation"] == 1

    proc = start_node(files, "--max-generations", "1")
    try:
        assert proc.wait(timeout=300) == 0, tail(files)
    finally:
        kill_group(proc)
    state = files.state()
    assert state["generation"] == 2 and state["promoted"] + state["rejected"] == 1, state
    assert state["stage"] == "collecting"
    runs = sorted(p.name for p in (files.data_dir / "runs").iterdir())
    assert runs == ["gen_0001"], f"generation trained in more than one run: {runs}"
    with ReplayDB(files.data_dir / "games.db") as db:
        after = db.uids()
        assert db.integrity_problems() == []
    assert before <= set(after), "games stored before the kill were lost"
    assert len(after) == len(set(after))
    with ModelRegistry(files.data_dir / "registry.db") as registry:
        models = registry.models()
    assert [m.generation for m in models] == [1]
    # lineage: the model names the dataset it was trained on, whose manifest is still there
    assert models[0].parent_sha256 is None  # generation 1 starts from nothing
    datasets = sorted((files.data_dir / "datasets").iterdir())
    assert [dataset_sha256(d) for d in datasets] == [models[0].dataset_sha256], datasets
    if state["promoted"]:
        assert (files.data_dir / "models" / f"{state['best_sha256']}.safetensors").exists()
        assert state["best_path"].endswith(f"{state['best_sha256']}.safetensors")


@pytest.mark.timeout(300)
def test_one_generation_promoted_then_sigterm_drains(tmp_path) -> None:
    files = write_node_files(tmp_path / "node")
    proc = start_node(files)
    try:
        wait_until(lambda: files.health("/readyz")[0] == 200, 60, what="ready")
        assert files.health("/livez")[0] == 200
        wait_until(lambda: files.state().get("promoted", 0) >= 1 and files.state().get("best_path", "")
                   .startswith(str(files.data_dir / "models")), 240, what="a promoted, distributed generation")
        status, body = files.health("/metrics")
        assert status == 200 and b"games_total" in body and b"promotions_total 1.0" in body
        daemons = {d["name"]: d for d in json.loads(files.health("/daemons")[1])["daemons"]}
        assert set(daemons) >= {"selfplay", "export", "train", "gauntlet", "promote", "distribution"}

        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        saw_503 = False
        while proc.poll() is None and time.monotonic() - sent < 35:
            saw_503 = saw_503 or files.health("/readyz")[0] == 503
            time.sleep(0.05)
        assert proc.poll() == 0, tail(files)
        assert time.monotonic() - sent < 30
        assert saw_503, "readiness should answer 503 while draining"
    finally:
        kill_group(proc)
    with ModelRegistry(files.data_dir / "registry.db") as registry:
        best = registry.current_best()
    assert best is not None and best.generation >= 1
