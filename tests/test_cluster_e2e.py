"""Three real orchestrator nodes on loopback train together; the leader is killed mid-run and
the cluster still promotes, losing and duplicating no game, and every node ends on the same
promoted model (the killed one too, once it is back)."""

from __future__ import annotations

import json
import os
import secrets
import signal

import pytest

from app.db.replay_db import ReplayDB
from tests.orchestrator_helpers import (
    BUSY_CPU_TIMING,
    SMALL_DAEMONS,
    TINY_CONFIG,
    NodeFiles,
    get_json,
    leader_of,
    nodes_running,
    start_voter,
    tiny_selfplay,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
# The smallest generation (TINY_CONFIG): this test is about the mesh around a generation, and
# each node's games, training and gauntlet were most of its CPU.
CONFIG = {**TINY_CONFIG, "mesh": {"timing": BUSY_CPU_TIMING}}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(16),
    "export": {"critical": True, "settings": {"min_new_games": 48, "poll_s": 0.5, "sync_budget_s": 20}},
}}


def _promoted(files: NodeFiles) -> dict | None:
    progress = get_json(files.mesh_port, "/progress")
    if not progress:
        return None
    promoted = [g for g in progress["generations"] if g["promoted"]]
    return promoted[-1] if promoted else None


@pytest.mark.timeout(1800)  # generous bounds (deadlines on state): two busy cores can be very busy
def test_three_nodes_promote_through_a_leader_kill(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, DAEMONS) for nid in IDS]
    procs = {nid: start_voter(nodes, IDS, i) for i, nid in enumerate(IDS)}
    with nodes_running(nodes, procs, stop_timeout=35):
        leader = wait_until(lambda: leader_of(nodes), 120, what="a leader")
        # Kill the leader once the cluster is working on its first generation.
        wait_until(lambda: any(f.state().get("stage", "collecting") != "collecting" for f in nodes), 600,
                   what="a generation in progress")
        killed = IDS.index(leader)
        os.killpg(procs[leader].pid, signal.SIGKILL)
        procs[leader].wait(timeout=10)
        survivors = [f for i, f in enumerate(nodes) if i != killed]
        new_leader = wait_until(lambda: leader_of(survivors), 120, what="a new leader")
        assert new_leader != leader

        record = wait_until(lambda: _promoted(survivors[0]), 900, interval=1.0, what="a promoted generation")
        procs[leader] = start_voter(nodes, IDS, killed)  # back, it must catch up
        assert record["generation"] >= 1

        def all_on_newest() -> bool:
            newest = max(((_promoted(f) or {}).get("generation", 0), (_promoted(f) or {}).get("sha256"))
                         for f in nodes)
            return {f.state().get("best_sha256") for f in nodes} == {newest[1]}

        wait_until(all_on_newest, 300, interval=1.0, what="every node on the newest promoted model")

    # Same promoted sha everywhere: one model per generation across the cluster.
    bests = {f.root.name: f.state()["best_sha256"] for f in nodes}
    generations = [json.loads((f.data_dir / "generations.json").read_text()) for f in nodes]
    by_generation: dict[int, set[str]] = {}
    for log in generations:
        for rec in log:
            by_generation.setdefault(rec["generation"], set()).add(rec["sha256"])
    assert all(len(shas) == 1 for shas in by_generation.values()), by_generation
    final = max(g for g, shas in by_generation.items()
                if any(r["promoted"] for log in generations for r in log if r["generation"] == g))
    final_sha = next(iter(by_generation[final]))
    assert set(bests.values()) == {final_sha}, bests

    # No game lost or duplicated: the union of uids equals the games the nodes created.
    union: set[str] = set()
    created = 0
    for files, nid in zip(nodes, IDS):
        with ReplayDB(files.data_dir / "games.db") as db:
            uids = db.uids()
            assert len(uids) == len(set(uids))
            assert db.integrity_problems() == []
            created += db.count_by_node(nid)
            union |= set(uids)
    assert len(union) == created
