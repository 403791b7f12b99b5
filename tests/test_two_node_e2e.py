"""Two real orchestrator nodes on loopback, one shared run, three promises checked on it:

- training spans nodes: the claimant of the training item gossips a rendezvous, the other node
  claims the join item, fetches the dataset by sha256 and runs node rank 1, and the claimant's
  run trains in a world of two;
- the gauntlet spreads: the node that did not train the generation plays part of its baseline
  games (shards claimed from the leader), the trainer records every one of them once;
- self-play plays the promoted model after distribution on every node: the games each node
  stores after its switch carry the new model's sha256 (not only the pipeline state saying so).

The run is shared (module fixture) because it is the expensive part. It waits for every file a
test reads (never for time), then stops both nodes, so nothing is read while it is being written.
The promotion gate is 0.0 vs random: these tests are about the mesh, not about strength, so
generation 1 is always promoted and no rejected generation forces another round.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

import pytest

from app.config.mesh import PROFILES
from app.db.registry import ModelRegistry, ModelStatus
from app.db.replay_db import ReplayDB
from tests.orchestrator_helpers import (
    SELFPLAY_REST_S,
    SMALL_CONFIG,
    SMALL_DAEMONS,
    NodeFiles,
    nodes_running,
    start_node,
    tail,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1"]
BASELINE_GAMES = 24
CONFIG = {
    **SMALL_CONFIG,
    "model": {"channels": 8, "blocks": 1},
    "search": {"simulations": 4},
    "selfplay": {"concurrent_games": 16, "workers": 0},  # inline: as TINY_CONFIG (orchestrator_helpers.py)
    "train": {"batch_size": 64, "epochs": 1, "max_nodes": 2, "span_cpu_nodes": True,
              "join_timeout_s": 150},  # generous: on two busy cores the joiner's torch takes a while to start
    "gauntlet": {"games_vs_baseline": BASELINE_GAMES, "shard_games": 2, "shard_wait_s": 60,
                 "max_games_vs_best": 2, "net_simulations": 2, "rollout_simulations": 8},
    "promotion": {"min_score_vs_random": 0.0, "min_score_vs_heuristic": None},
    # one voter (n0), and a claim TTL and request timeout that a busy CPU cannot lapse (a claimant
    # renewing through its own loaded server): these tests are about spanning and spreading, not
    # elections (a two-voter mesh flaps under heavy load)
    "mesh": {"timing": {**PROFILES["fast"].model_dump(), "claim_ttl": 20.0, "request_timeout": 3.0}},
}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 16, "simulations": 4, "rest_s": SELFPLAY_REST_S}},
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5, "sync_budget_s": 10}},
    "train_join": {"settings": {"poll_s": 0.5}, "stop_timeout_s": 15},
    "gauntlet_shards": {"settings": {"poll_s": 0.3}},
}}


@dataclass
class TwoNodeRun:
    record: dict  # generation 1 as both nodes hold it
    trainer: NodeFiles
    peer: NodeFiles


def read_json(path: Path) -> dict | list | None:
    """A file a node writes atomically (temp, fsync, rename): absent or whole."""
    return json.loads(path.read_text()) if path.exists() else None


def decided(files: NodeFiles, generation: int = 1) -> dict | None:
    """`generation` as this node durably holds it (generations.json, never /progress of a node
    that may have exited)."""
    records = read_json(files.data_dir / "generations.json") or []
    return next((g for g in records if g["generation"] == generation), None)


def own_games(files: NodeFiles, node_id: str) -> list:
    with ReplayDB(files.data_dir / "games.db", create=False, readonly=True) as db:
        return [g for g in db.games() if g.node_id == node_id]


def plays_model(files: NodeFiles, node_id: str, sha256: str) -> bool:
    return any(g.model_sha256 == sha256 for g in own_games(files, node_id))


@pytest.fixture(scope="module")
def two_node_run(tmp_path_factory) -> TwoNodeRun:
    root = tmp_path_factory.mktemp("two_nodes")
    nodes = [write_node_files(root / nid, nid, CONFIG, DAEMONS) for nid in IDS]
    procs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESH_SECRET", secrets.token_hex(16))
        for i, files in enumerate(nodes):
            other = 1 - i
            procs.append(start_node(files, "--voters", IDS[0], "--peers",
                                    f"{IDS[other]}@127.0.0.1:{nodes[other].mesh_port}", "--priority", str(i),
                                    "--profile", "fast"))
    with nodes_running(nodes, procs, tail_chars=4000):
        wait_until(lambda: all(decided(f) for f in nodes), 900, interval=0.5, what="generation 1 decided on both")
        record = decided(nodes[0])
        trainer = nodes[IDS.index(record["trained_by"])]
        peer = nodes[1 - IDS.index(record["trained_by"])]
        # Every file the tests read, waited for: the joiner writes its result after its rank exits.
        wait_until(lambda: (peer.data_dir / "runs" / "join_gen_0001" / "join_result.json").exists(), 60,
                   what="the joiner's join_result.json")
        assert record["promoted"], record  # gate 0.0: generation 1 is promoted
        for files, nid in ((trainer, record["trained_by"]), (peer, peer.root.name)):
            wait_until(lambda f=files, n=nid: plays_model(f, n, record["sha256"]), 400, interval=0.5,
                       what=f"{nid} storing games played with the promoted model")
    # stopped: everything below reads files of stopped nodes
    return TwoNodeRun(record, trainer, peer)


@pytest.mark.timeout(1300)
def test_two_nodes_train_one_generation_together(two_node_run: TwoNodeRun) -> None:
    claimant, joiner = two_node_run.trainer, two_node_run.peer
    result = read_json(claimant.data_dir / "runs" / "gen_0001" / "result.json")
    assert result is not None and result["world_size"] == 2, result
    joined = read_json(joiner.data_dir / "runs" / "join_gen_0001" / "join_result.json")
    assert joined["status"] == "completed" and joined["node_rank"] == 1 and joined["nnodes"] == 2, joined
    assert joined["claimant"] == claimant.root.name and joined["dataset_sha256"] == result["dataset_sha256"]
    # The joiner trained on the claimant's exact dataset, fetched by its sha256.
    assert (joiner.data_dir / "datasets" / result["dataset_sha256"] / "manifest.json").exists()
    assert not (joiner.data_dir / "runs" / "gen_0001").exists()  # it did not train generation 1 itself
    assert decided(claimant) == decided(joiner) == two_node_run.record


@pytest.mark.timeout(1300)
def test_a_peer_plays_part_of_the_gauntlet_of_a_generation_it_did_not_train(two_node_run: TwoNodeRun) -> None:
    record, trainer, peer = two_node_run.record, two_node_run.trainer, two_node_run.peer
    shard_prefix = f"gauntlet:generation-1-{record['sha256'][:12]}-random-"  # the decided candidate's shards
    with ModelRegistry(peer.data_dir / "registry.db") as registry:
        peer_games = [g for g in registry.match_games() if g.match_id.startswith(shard_prefix)]
    with ModelRegistry(trainer.data_dir / "registry.db") as registry:
        trainer_games = registry.match_games()
        candidate = registry.require(record["sha256"])
        history = [h.new_status for h in registry.history(record["sha256"])]
    assert peer_games, f"{peer.root.name} played no shard of generation 1\n{tail(peer, 3000)}"
    assert {g.uid for g in peer_games} <= {g.uid for g in trainer_games}  # recorded where the Elo is fit
    shard_uids = [g.uid for g in trainer_games if g.uid.startswith(shard_prefix)]
    assert len(shard_uids) == len(set(shard_uids)) == BASELINE_GAMES  # every baseline game once
    assert candidate.generation == 1 and ModelStatus.PROMOTED in history, (candidate, history)


@pytest.mark.timeout(1300)
def test_every_node_plays_the_promoted_model_after_distribution(two_node_run: TwoNodeRun) -> None:
    sha = two_node_run.record["sha256"]
    for files in (two_node_run.trainer, two_node_run.peer):
        nid = files.root.name
        assert (files.data_dir / "models" / f"{sha}.safetensors").exists()  # installed, verified by sha256
        games = own_games(files, nid)
        first = next(i for i, g in enumerate(games) if g.model_sha256 == sha)
        assert all(g.model_sha256 is None for g in games[:first]), nid  # uniform before generation 1
        # after its switch, no game of this node is played without a model (batches run in order)
        assert all(g.model_sha256 is not None for g in games[first:]), nid
