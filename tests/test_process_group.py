"""Which device a rank trains on and a self-play worker evaluates on, and the GPU profile's files.

The rule is a pure function, so its GPU cases are checked here without a GPU; the trainer's
refusal of `--device cuda` runs as a real subprocess with no GPU visible.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.config import Settings, load_settings
from app.coordination.daemons.dlq_retry import INFRA_RUNNERS
from app.coordination.daemons.daemon_registry import load_registry
from app.coordination.pipeline.runners import pipeline_runners
from app.shared.process_group import DeviceChoiceError, choose_device, network_device, visible_gpus
from tests.conftest import REPO


@pytest.mark.parametrize("pref, ranks, gpus, expected", [
    ("cpu", 1, 0, "cpu"), ("cpu", 2, 8, "cpu"),
    ("auto", 1, 0, "cpu"), ("auto", 1, 1, "cuda"), ("auto", 2, 2, "cuda"), ("auto", 4, 8, "cuda"),
    ("auto", 2, 1, "cpu"),  # more ranks than GPUs: gloo on the CPU, not a set_device failure
    ("cuda", 1, 1, "cuda"), ("cuda", 8, 8, "cuda"),
])
def test_choose_device(pref: str, ranks: int, gpus: int, expected: str) -> None:
    assert choose_device(pref, ranks, gpus) == expected


def test_cuda_with_too_few_gpus_is_refused_with_the_counts() -> None:
    with pytest.raises(DeviceChoiceError, match=r"2 rank\(s\) on this node but 1 CUDA device"):
        choose_device("cuda", 2, 1)
    with pytest.raises(DeviceChoiceError, match="0 CUDA device"):
        choose_device("cuda", 1, 0)
    with pytest.raises(DeviceChoiceError, match="one of auto, cpu, cuda"):
        choose_device("gpu", 1, 1)
    with pytest.raises(DeviceChoiceError, match="at least one rank"):
        choose_device("auto", 0, 1)


def test_network_device_follows_what_this_machine_has() -> None:
    assert network_device("cpu") == torch.device("cpu")
    if torch.cuda.is_available():
        assert network_device("auto").type == network_device("cuda").type == "cuda"
    else:
        assert network_device("auto") == torch.device("cpu")
        with pytest.raises(DeviceChoiceError, match="no CUDA device is visible"):
            network_device("cuda")


def test_trainer_refuses_cuda_without_a_gpu_with_exit_2_and_a_reason(tmp_path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, "-m", "app.games.train.train", "--dataset", str(tmp_path / "ds"), "--run-dir",
         str(tmp_path / "run"), "--device", "cuda"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "training input error" in proc.stderr and "0 CUDA device(s) visible" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


def test_selfplay_device_is_validated() -> None:
    assert Settings().selfplay.device == "cpu"  # the 2-core default: no GPU asked for
    with pytest.raises(ValueError):
        Settings.model_validate({"selfplay": {"device": "gpu"}})


def test_gpu_profile_files_load() -> None:
    settings = load_settings(REPO / "configs" / "gpu.yaml")
    assert settings.selfplay.device == "auto" and settings.train.nproc == 0
    registry = load_registry(REPO / "configs" / "gpu_daemons.yaml",
                             {**INFRA_RUNNERS, **pipeline_runners(None)})
    specs = {spec.name: spec for spec in registry.select("all")}
    assert dict(specs["selfplay"].settings)["pause_while_evaluating"] is False
    assert set(specs) >= {"selfplay", "export", "train", "gauntlet", "promote", "distribution"}


def test_a_node_gossips_the_cuda_devices_it_sees(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The leader makes training require a GPU when a live node has one (scheduling.py): the
    count must reach the gossip (the machine's driver and CUDA runtime faked, not our code).
    Without a driver the runtime is not asked (app/shared/gpus.py)."""
    from app.p2p_orchestrator import machine_capabilities
    from app.shared import gpus

    assert machine_capabilities()["gpus"] == visible_gpus()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(gpus, "DRIVER_PATHS", (str(tmp_path / "no-driver"),))
    assert machine_capabilities()["gpus"] == 0
    monkeypatch.setattr(gpus, "DRIVER_PATHS", (str(tmp_path),))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    capabilities = machine_capabilities()
    assert capabilities["gpus"] == 2 and capabilities["cpus"] >= 1
