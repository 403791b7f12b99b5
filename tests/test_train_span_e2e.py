"""Two real orchestrator nodes on loopback train one generation together: the claimant of the
training item gossips a rendezvous, the other node claims the join item, fetches the dataset by
sha256 and runs node rank 1, and the claimant's run trains in a world of two."""

from __future__ import annotations

import json
import secrets
import time

import pytest

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
CONFIG = {
    **SMALL_CONFIG,
    "model": {"channels": 8, "blocks": 1},
    "search": {"simulations": 4},
    "selfplay": {"concurrent_games": 16},
    "train": {"batch_size": 64, "epochs": 1, "max_nodes": 2, "span_cpu_nodes": True, "join_timeout_s": 60},
    "gauntlet": {"games_vs_baseline": 2, "max_games_vs_best": 2, "net_simulations": 2, "rollout_simulations": 8},
    "promotion": {"min_score_vs_random": 0.0, "min_score_vs_heuristic": None},
}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 16, "simulations": 4}},
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5, "sync_budget_s": 10}},
    "train_join": {"settings": {"poll_s": 0.5}, "stop_timeout_s": 15},
}}


def _decided(files: NodeFiles) -> dict | None:
    """Generation 1 as this node durably holds it: read from its files, since with
    --max-generations 1 a node may already have exited when we look."""
    path = files.data_dir / "generations.json"
    try:
        records = json.loads(path.read_text()) if path.exists() else []
    except ValueError:
        return None  # never half-written (atomic), but be safe
    return next((g for g in records if g["generation"] == 1), None)


@pytest.mark.timeout(150)
def test_two_nodes_train_one_generation_together(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, DAEMONS) for nid in IDS]
    procs = []
    for i, files in enumerate(nodes):
        other = 1 - i
        procs.append(start_node(files, "--voters", ",".join(IDS), "--peers",
                                f"{IDS[other]}@127.0.0.1:{nodes[other].mesh_port}", "--priority", str(i),
                                "--profile", "fast", "--max-generations", "1"))
    started = time.monotonic()
    try:
        wait_until(lambda: all(_decided(f) for f in nodes), 110, interval=0.5, what="generation 1 decided on both")
        claimant = next(f for f in nodes if (f.data_dir / "runs" / "gen_0001" / "result.json").exists())
        joiner = next(f for f in nodes if f is not claimant)
        result = json.loads((claimant.data_dir / "runs" / "gen_0001" / "result.json").read_text())
        assert result["world_size"] == 2, result
        joined = json.loads((joiner.data_dir / "runs" / "join_gen_0001" / "join_result.json").read_text())
        assert joined["status"] == "completed" and joined["node_rank"] == 1 and joined["nnodes"] == 2
        assert joined["claimant"] == claimant.root.name and joined["dataset_sha256"] == result["dataset_sha256"]
        # The joiner trained on the claimant's exact dataset, fetched by its sha256.
        assert (joiner.data_dir / "datasets" / result["dataset_sha256"] / "manifest.json").exists()
        record = _decided(claimant)
        assert record["trained_by"] == claimant.root.name and _decided(joiner) == record
        print(f"generation 1 trained across two nodes and committed after {time.monotonic() - started:.1f}s")
    except (AssertionError, StopIteration, OSError):
        for files in nodes:
            print(f"--- {files.root.name}\n{tail(files, 4000)}")
        raise
    finally:
        stop_nodes(procs, timeout=30)
