"""Two real orchestrator nodes: the node that did not train a generation plays part of its
baseline games (shards claimed from the leader), the trainer records every one of them and
the generation is decided as on a lone node."""

from __future__ import annotations

import json
import secrets
import urllib.request

import pytest

from app.db.registry import ModelRegistry
from tests.orchestrator_helpers import (
    SMALL_CONFIG,
    SMALL_DAEMONS,
    NodeFiles,
    start_node,
    stop_nodes,
    tail,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1"]
CONFIG = {**SMALL_CONFIG, "search": {"simulations": 4}, "train": {"batch_size": 128, "epochs": 1},
          "gauntlet": {**SMALL_CONFIG["gauntlet"], "games_vs_baseline": 24, "shard_games": 2, "shard_wait_s": 60,
                       "net_simulations": 4}}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 16, "simulations": 4}},
    "export": {"critical": True, "settings": {"min_new_games": 48, "poll_s": 0.5, "sync_budget_s": 20}},
    "gauntlet_shards": {"settings": {"poll_s": 0.3}},
}}


def _get(port: int, path: str) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def _decided(files: NodeFiles) -> dict | None:
    progress = _get(files.mesh_port, "/progress")
    return progress["generations"][0] if progress and progress.get("generations") else None


@pytest.mark.timeout(150)
def test_a_peer_plays_part_of_the_gauntlet_of_a_generation_it_did_not_train(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, DAEMONS) for nid in IDS]
    procs = {}
    for i, (nid, files) in enumerate(zip(IDS, nodes)):
        other = 1 - i
        procs[nid] = start_node(files, "--voters", "n0", "--peers", f"{IDS[other]}@127.0.0.1:{nodes[other].mesh_port}",
                                "--priority", str(1 - i), "--profile", "fast", "--max-generations", "1")
    try:
        record = wait_until(lambda: _decided(nodes[0]) and _decided(nodes[1]), 120, interval=0.5,
                            what="generation 1 decided on both nodes")
    except AssertionError:
        for files in nodes:
            print(f"--- {files.root.name}\n{tail(files, 4000)}")
        raise
    finally:
        stop_nodes(procs.values(), timeout=30)

    assert record["generation"] == 1
    trainer = nodes[IDS.index(record["trained_by"])]
    peer = nodes[1 - IDS.index(record["trained_by"])]
    shard_prefix = f"gauntlet:generation-1-{record['sha256'][:12]}-random-"  # the decided candidate's shards
    with ModelRegistry(peer.data_dir / "registry.db") as registry:
        peer_games = [g for g in registry.match_games() if g.match_id.startswith(shard_prefix)]
    with ModelRegistry(trainer.data_dir / "registry.db") as registry:
        trainer_games = registry.match_games()
    assert peer_games, f"{peer.root.name} played no shard of generation 1\n{tail(peer, 3000)}"
    assert {g.uid for g in peer_games} <= {g.uid for g in trainer_games}  # recorded where the Elo is fit
    shard_uids = [g.uid for g in trainer_games if g.uid.startswith(shard_prefix)]
    assert len(shard_uids) == len(set(shard_uids)) == 24  # every baseline game once
    evaluation = trainer.state()
    assert evaluation.get("promoted", 0) + evaluation.get("rejected", 0) == 1
