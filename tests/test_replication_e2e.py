"""Acceptance of continuous replication with three real orchestrator nodes on loopback: they
play; one is killed and its data dir deleted, and the other two hold every game it finished
more than a few seconds before; after a quiet interval every node holds at least its
replication factor's share, nothing is under-replicated, and the union counts each game once."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import time

import pytest

from app.db.replay_db import GameRow, ReplayDB
from tests.orchestrator_helpers import (
    SMALL_CONFIG,
    NodeFiles,
    get_json,
    start_voter,
    stop_nodes,
    tail,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
LAG_S = 8.0  # "finished more than a few seconds before" the kill
CONFIG = {**SMALL_CONFIG, "search": {"simulations": 4}, "selfplay": {"concurrent_games": 8},
          "replication": {"factor": 2}}
PLAYING = {"restart": {"base_s": 0.5, "cap_s": 5}, "daemons": {
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 8, "simulations": 4, "rest_s": 1.0}},
    "replication": {"settings": {"interval_s": 0.5}},
}}
QUIET = {"restart": {"base_s": 0.5, "cap_s": 5}, "daemons": {"replication": {"settings": {"interval_s": 0.5}}}}


def _start(nodes: list[NodeFiles], i: int):
    return start_voter(nodes, IDS, i)


def _games(files: NodeFiles) -> dict[str, tuple[str, float]]:
    """uid -> (origin, finished_at) of every game in the node's DB; {} before it exists."""
    path = files.data_dir / "games.db"
    if not path.exists():
        return {}
    with ReplayDB(path) as db:
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        with Session(db.engine) as session:
            rows = session.execute(select(GameRow.uid, GameRow.node_id, GameRow.finished_at)).all()
    return {uid: (origin, at) for uid, origin, at in rows}


def _set_daemons(files: NodeFiles, daemons: dict) -> None:
    import yaml

    files.daemons.write_text(yaml.safe_dump(daemons))


@pytest.mark.timeout(600)
def test_a_lost_node_loses_no_settled_game_and_the_quiet_cluster_meets_the_factor(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, PLAYING) for nid in IDS]
    procs = {nid: _start(nodes, i) for i, nid in enumerate(IDS)}
    victim = nodes[2]
    began = time.time()
    try:
        # Play until the victim has games that finished well before now (and the others play too).
        def settled_on_victim() -> bool:
            games = _games(victim)
            old = [u for u, (o, at) in games.items() if o == "n2" and at < time.time() - LAG_S - 1]
            return len(old) >= 4 and all(
                any(o == nid for o, _ in _games(f).values()) for nid, f in zip(IDS, nodes))

        wait_until(settled_on_victim, 300, interval=1.0, what="settled games on every node")
        os.killpg(procs["n2"].pid, signal.SIGKILL)
        procs["n2"].wait(timeout=10)
        killed_at = time.time()
        victim_games = _games(victim)
        shutil.rmtree(victim.data_dir)
        settled = {u for u, (o, at) in victim_games.items() if o == "n2" and at < killed_at - LAG_S}
        survivors = set(_games(nodes[0])) | set(_games(nodes[1]))
        assert settled and settled <= survivors, f"lost {len(settled - survivors)} of {len(settled)} settled games"
        lost = {u for u, (o, _) in victim_games.items() if o == "n2"} - survivors
        print(f"victim made {sum(o == 'n2' for o, _ in victim_games.values())} games; "
              f"{len(lost)} not yet replicated at the kill")

        # Quiet: everyone stops playing (killed too: a game is in the DB whole or not at all);
        # the wiped node comes back empty.
        for nid in ("n0", "n1"):
            os.killpg(procs[nid].pid, signal.SIGKILL)
            procs[nid].wait(timeout=10)
        print(f"phase 1 (play, kill, check) took {time.time() - began:.0f} s")
        for files in nodes:
            _set_daemons(files, QUIET)
        procs = {nid: _start(nodes, i) for i, nid in enumerate(IDS)}
        created = {u for f in nodes[:2] for u, (o, _) in _games(f).items()}  # nothing new is made now

        def converged() -> bool:
            held = [_games(f) for f in nodes]
            share = math.ceil(2 * len(created) / len(IDS))
            if not all(len(h) >= share for h in held):
                return False
            if set().union(*held) != created:
                return False
            for files in nodes:
                rep = ((get_json(files.mesh_port, "/status") or {}).get("inventory") or {}).get("replication")
                if not rep or rep["under_replicated"] != 0 or rep["held"] != len(_games(files)):
                    return False
            return True

        wait_until(converged, 180, interval=1.0, what="every node at its share, nothing under-replicated")
        print(f"quiet cluster converged {time.time() - began:.0f} s after the start")
        status = get_json(nodes[0].mesh_port, "/status")
        rep = status["inventory"]["replication"]
        assert rep["factor"] == 2 and set(rep["own_held_by"]) == {"n1", "n2"}
        assert rep["own_held_by"]["n1"] + rep["own_held_by"]["n2"] >= rep["own"]

        def peers_seen() -> bool:  # every node's copies, on one node's /status (gossip may lag a round)
            seen = {p["node_id"]: p["replication"] for p in (get_json(nodes[0].mesh_port, "/status") or {}).get("peers", [])}
            return all(seen.get(nid) and seen[nid]["held"] >= math.ceil(2 * len(created) / 3) for nid in ("n1", "n2"))

        wait_until(peers_seen, 30, interval=0.5, what="the peers' copies on n0's /status")
        code, metrics = nodes[0].health("/metrics")
        assert code == 200 and b'mesh_games_under_replicated{node="n0"} 0.0' in metrics
    except AssertionError:
        for files in nodes:
            print(f"--- {files.root.name}\n{tail(files, 3000)}")
        raise
    finally:
        stop_nodes(procs.values(), timeout=35)

    # Each game once per node, every game of the cluster somewhere.
    union: set[str] = set()
    for files in nodes:
        with ReplayDB(files.data_dir / "games.db") as db:
            uids = db.uids()
            assert len(uids) == len(set(uids)) and db.integrity_problems() == []
            union |= set(uids)
    assert union == created
