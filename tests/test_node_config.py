"""The node config (`--config FILE.yaml`) is strict: an unknown key anywhere in it is an error
naming the file and the dotted key, from the loader and from a real node process, which exits
2 before it opens a port or writes a data dir (README: "an unknown key is an error naming the
file and key"; daemons.yaml has its own tests in test_daemon_registry.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import ConfigError, load_settings
from app.config.mesh import PROFILES
from tests.orchestrator_helpers import ROOT

# One misspelt key per place a key can hide: the top level, every section, nested models.
UNKNOWN_KEYS = [
    ({"selfpaly": {"batch_games": 8}}, "selfpaly"),
    ({"node": {"node_id": "a", "data_dri": "/x"}}, "node.data_dri"),
    ({"mesh": {"peer": ["b@127.0.0.1:1"]}}, "mesh.peer"),
    ({"mesh": {"timing": {**PROFILES["fast"].model_dump(), "heartbeat": 1.0}}}, "mesh.timing.heartbeat"),
    ({"model": {"channels": 8, "block": 1}}, "model.block"),
    ({"search": {"simulation": 8}}, "search.simulation"),
    ({"selfplay": {"concurrent_game": 8}}, "selfplay.concurrent_game"),
    ({"export": {"window_game": 8}}, "export.window_game"),
    ({"train": {"epochz": 3}}, "train.epochz"),
    ({"gauntlet": {"games_vs_baselines": 4}}, "gauntlet.games_vs_baselines"),
    ({"promotion": {"min_score_vs_randm": 0.5}}, "promotion.min_score_vs_randm"),
]


@pytest.mark.parametrize(("data", "key"), UNKNOWN_KEYS, ids=[k for _, k in UNKNOWN_KEYS])
def test_an_unknown_key_is_an_error_naming_file_and_key(tmp_path: Path, data: dict, key: str) -> None:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ") and f"{key}: Extra inputs are not permitted" in message, message


def test_the_same_file_without_the_typo_loads(tmp_path: Path) -> None:
    """The tests above fail for the key, not for the file: corrected, each section loads."""
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"train": {"epochs": 3}, "mesh": {"timing": PROFILES["fast"].model_dump()}}))
    settings = load_settings(path)
    assert settings.train.epochs == 3 and settings.mesh.timing_profile() == PROFILES["fast"]


@pytest.mark.timeout(120)
def test_a_node_started_with_an_unknown_key_exits_2_naming_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    data_dir = tmp_path / "data"
    path.write_text(yaml.safe_dump({"node": {"node_id": "a", "data_dir": str(data_dir)},
                                    "train": {"epochs": 1, "batch_sise": 64}}))
    proc = subprocess.run([sys.executable, "-m", "app.p2p_orchestrator", "--config", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=100, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {path}: train.batch_sise: Extra inputs are not permitted" in proc.stderr, proc.stderr
    assert not data_dir.exists()  # refused before anything was written


NODE_CONFIGS = sorted(p for p in (ROOT / "configs").glob("*.yaml") if not p.name.endswith("_daemons.yaml"))


@pytest.mark.parametrize("path", NODE_CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_loads(path: Path) -> None:
    """The node configs the docs point users at (the GPU profile, the benchmarks') stay valid as
    the settings change: a renamed key fails here, not on a user's node. (Daemons files:
    tests/test_daemon_registry.py.)"""
    settings = load_settings(path)
    assert settings.model_dump() != type(settings)().model_dump(), f"{path} changes no setting"


def test_nodes_started_with_defaults_on_one_host_get_distinct_ids() -> None:
    import socket

    from app.config import load_settings
    from app.p2p_orchestrator import build_parser, node_settings

    host = socket.gethostname()
    assert load_settings(None).node.node_id == host  # the default port: the host name, as before
    assert load_settings(None, node={"mesh_port": 8771}).node.node_id == f"{host}-8771"
    assert load_settings(None, node={"mesh_port": 8771, "node_id": "n1"}).node.node_id == "n1"
    ids = {node_settings(build_parser().parse_args(["--port", str(p)])).node.node_id for p in (8770, 8771, 8772)}
    assert ids == {host, f"{host}-8771", f"{host}-8772"}
    assert node_settings(build_parser().parse_args(["--port", "8771", "--node-id", "a"])).node.node_id == "a"


async def test_max_generations_with_several_configs_stops_once_every_config_decided_that_many(tmp_path) -> None:
    """Issue 52: `--max-generations N` on a node with `configs:` means N decided generations of
    every config (not of the first): the node drains only when the last config gets there."""
    import asyncio
    from dataclasses import replace

    from app.config.configs import lineage_settings
    from app.coordination.daemons.daemon_registry import build_registry
    from app.coordination.daemons.event_router import EventRouter
    from app.coordination.daemons.manager import DaemonManager
    from app.p2p_orchestrator import _stop_after, build_parser
    from app.workloads import pipeline_context

    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"node": {"data_dir": str(tmp_path / "data")}, "configs": [
        {"name": "c4", "game": "connect4"}, {"name": "small", "game": "connect4_5x4"}]}))
    settings = load_settings(path)
    pipes = [pipeline_context(s, config_path=None) for _, s in lineage_settings(settings)]
    manager = DaemonManager(build_registry({"daemons": {}}, {}).select("all"), router=EventRouter(), settings=settings)
    stopper = asyncio.create_task(_stop_after(pipes, manager, 1))
    await pipes[0].update(lambda s: replace(s, rejected=1))  # the first config is there
    await asyncio.sleep(0.5)
    assert not stopper.done() and manager.readiness().reason != "draining"
    await pipes[1].update(lambda s: replace(s, rejected=1))  # and now the second
    await asyncio.wait_for(stopper, 10)
    assert manager.readiness().reason == "draining"
    assert "every config" in build_parser().format_help()


def test_an_lm_config_beside_a_game_config_is_its_own_lm_lineage_and_mixing_is_refused(tmp_path) -> None:
    """Issue 52 item 5: `configs:` may list an lm config (workload: lm, its `lm:` section) beside
    the games; its lineage runs the lm workload in `configs/<name>/` on its own port, and the file
    its torchrun reads loads as an lm node's (no game setting in it). A game section, `game` or a
    game-only train key on an lm config, or `lm:` on a game config, is refused naming the config."""
    from app.config.configs import lineage_settings
    from app.p2p_orchestrator import lineage_yaml

    lm = yaml.safe_load((ROOT / "configs" / "lm_copy.yaml").read_text())["lm"]
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"node": {"data_dir": str(tmp_path / "data")}, "configs": [
        {"name": "c4", "game": "connect4"}, {"name": "copy", "workload": "lm", "lm": lm, "train": {"nproc": 1}}]}))
    (c4, game), (copy, lineage) = lineage_settings(load_settings(path))
    assert (game.workload, lineage.workload, copy.label) == ("connect4", "lm", "lm")
    assert lineage.node.data_dir == tmp_path / "data" / "configs" / "copy" and lineage.node.mesh_port == game.node.mesh_port + 100
    own = tmp_path / "lineage.yaml"
    own.write_text(lineage_yaml(lineage))
    assert load_settings(own).lm == lineage.lm and load_settings(own).workload == "lm"
    for bad, why in (({"game": "connect4"}, "not \\['game'\\]"), ({"search": {"simulations": 4}}, "search"),
                     ({"train": {"lr": 0.1}}, "train.lr")):
        path.write_text(yaml.safe_dump({"configs": [{"name": "c4", "game": "connect4"},
                                                    {"name": "copy", "workload": "lm", "lm": lm, **bad}]}))
        with pytest.raises(ConfigError, match=f"config copy: an lm config takes lm:.*{why}"):
            load_settings(path)
    path.write_text(yaml.safe_dump({"configs": [{"name": "c4", "game": "connect4", "lm": lm}]}))
    with pytest.raises(ConfigError, match="config c4: lm: is for an lm config"):
        load_settings(path)
