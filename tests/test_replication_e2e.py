"""Acceptance of replication with three real orchestrator nodes on loopback, self-play at its
fastest config (8 simulations, 16-game batches, no rest, a tiny net; issue 45, item 5).

One node is killed with SIGKILL while every node plays, and its data dir deleted: every game it
had reported in /status before the kill, and every game it finished more than RECENT_S before the
kill, is on a survivor. Then production stops (the survivors' self-play workers are paused)
and the wiped node comes back empty: within seconds nothing is under-replicated, every node
holds at least its share, and the union counts each game once."""

from __future__ import annotations

import math
import os
import secrets
import shutil
import signal
import time

import pytest
import yaml

from app.db.replay_db import GameRow, ReplayDB
from tests.orchestrator_helpers import (
    NodeFiles,
    get_json,
    nodes_running,
    signal_descendants,
    start_voter,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
# Games finished this shortly before the kill may be lost with the node. The aim is one second
# (bench_replication.py measures the push lag on a quiet host: docs/benchmarks/replication.md);
# inside the suite the other xdist worker runs a cluster of its own on the same two cores, and
# CI saw games 1.02-1.03 s old still on their way: the test allows the aim plus one second.
RECENT_S = 2.0
# The fastest self-play config: a tiny net, 8 simulations, batches of 16 with no rest.
CONFIG = {"model": {"channels": 8, "blocks": 1}, "search": {"simulations": 8},
          "selfplay": {"concurrent_games": 16, "collect_workers": 1},
          "train": {"batch_size": 64, "epochs": 1}, "replication": {"factor": 2}}
PLAYING = {"restart": {"base_s": 0.5, "cap_s": 5}, "daemons": {
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 16, "simulations": 8, "rest_s": 0.0}},
    "replication": {},  # its shipped settings: games pushed as they finish, a repair round a second
}}
QUIET = {"restart": {"base_s": 0.5, "cap_s": 5}, "daemons": {"replication": {"settings": {"interval_s": 0.5}}}}


def _games(files: NodeFiles) -> dict[str, tuple[str, float, int]]:
    """uid -> (origin, finished_at, row id) of every game in the node's DB; {} before it exists."""
    path = files.data_dir / "games.db"
    if not path.exists():
        return {}
    with ReplayDB(path) as db:
        from sqlalchemy import select
        from sqlalchemy.orm import Session

        with Session(db.engine) as session:
            rows = session.execute(select(GameRow.uid, GameRow.node_id, GameRow.finished_at, GameRow.id)).all()
    return {uid: (origin, at, row) for uid, origin, at, row in rows}


@pytest.mark.timeout(600)
def test_a_node_killed_mid_self_play_loses_at_most_its_last_second_and_the_quiet_cluster_meets_the_factor(
        tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, PLAYING) for nid in IDS]
    procs = {nid: start_voter(nodes, IDS, i) for i, nid in enumerate(IDS)}
    victim = nodes[2]
    began = time.time()
    reported = 0  # the victim's own games, as its /status said last before the kill
    first_game_at: float | None = None
    # killed, not drained: a paused batch must not add games now (each is stored whole or not at all)
    with nodes_running(nodes, procs, kill=True):
        def playing_for_a_while() -> bool:
            nonlocal reported, first_game_at
            dead = [nid for nid, proc in procs.items() if proc.poll() is not None]
            assert not dead, f"{dead} exited before the kill (logs below)"
            status = get_json(victim.mesh_port, "/status") or {}
            reported = max(reported, int((status.get("inventory") or {}).get("games_created") or 0))
            if reported and first_game_at is None:
                first_game_at = time.time()
            return (reported >= 48 and first_game_at is not None and time.time() - first_game_at > 4
                    and all(any(o == nid for o, _, _ in _games(f).values()) for nid, f in zip(IDS, nodes)))

        wait_until(playing_for_a_while, 300, interval=0.25, what="every node playing, the victim for seconds")
        os.killpg(procs["n2"].pid, signal.SIGKILL)
        killed_at = time.time()
        procs["n2"].wait(timeout=10)
        print(f"killed n2 {killed_at - began:.0f} s after the start; it had reported {reported} games")
        made = {u: g for u, g in _games(victim).items() if g[0] == "n2"}
        shutil.rmtree(victim.data_dir)
        first_reported = sorted(made, key=lambda u: made[u][2])[:reported]
        owed = {u for u, g in made.items() if g[1] < killed_at - RECENT_S} | set(first_reported)
        # a push the survivors had received whole before the kill may still be on its way into
        # their stores: poll (the victim and its disk are gone, so nothing new can arrive)
        settle_by = time.time() + 10.0
        while True:
            survivors = set(_games(nodes[0])) | set(_games(nodes[1]))
            if owed <= survivors or time.time() > settle_by:
                break
            time.sleep(0.2)
        lost = {u: g for u, g in made.items() if u not in survivors}
        old_lost = {u: round(killed_at - g[1], 2) for u, g in lost.items() if g[1] < killed_at - RECENT_S}
        print(f"n2 made {len(made)} games; {len(lost)} not on a survivor, ages {sorted(old_lost.values())[:10]}")
        assert not old_lost, f"games finished more than {RECENT_S} s before the kill were lost: {old_lost}"
        assert len(first_reported) == reported and all(u in survivors for u in first_reported)
        for files in nodes[:2]:  # the replication lag is on /status and in /metrics
            rep = ((get_json(files.mesh_port, "/status") or {}).get("inventory") or {}).get("replication") or {}
            assert rep.get("push", {}).get("lag_s", {}).get("p99") is not None, rep
            code, metrics = files.health("/metrics")
            assert code == 200 and b"mesh_replication_lag_seconds_count" in metrics

        # Quiet: the survivors stop playing; the wiped node comes back empty, without self-play.
        signal_descendants([procs["n0"], procs["n1"]], signal.SIGSTOP)
        stopped_at = time.time()
        seen: list[set[str]] = []

        def nothing_new() -> bool:  # games already on their way from a paused worker are stored first
            seen.append({u for f in nodes[:2] for u in _games(f)})
            return len(seen) > 1 and seen[-1] == seen[-2]

        wait_until(nothing_new, 30, interval=1.0, what="no new games after the workers paused")
        created = seen[-1]
        victim.daemons.write_text(yaml.safe_dump(QUIET))
        procs["n2"] = start_voter(nodes, IDS, 2)

        def survivors_drained() -> bool:
            reps = [((get_json(f.mesh_port, "/status") or {}).get("inventory") or {}).get("replication")
                    for f in nodes[:2]]
            return all(r and r["under_replicated"] == 0 for r in reps)

        wait_until(survivors_drained, 60, interval=0.5, what="the survivors' games on the factor's nodes")
        print(f"survivors drained {time.time() - stopped_at:.1f} s after production stopped")

        def converged() -> bool:
            held = [_games(f) for f in nodes]
            share = math.ceil(2 * len(created) / len(IDS))
            if not all(len(h) >= share for h in held) or set().union(*held) != created:
                return False
            for files in nodes:
                rep = ((get_json(files.mesh_port, "/status") or {}).get("inventory") or {}).get("replication")
                if not rep or rep["under_replicated"] != 0 or rep["held"] != len(_games(files)):
                    return False
            return True

        wait_until(converged, 120, interval=1.0, what="every node at its share, nothing under-replicated")
        print(f"quiet cluster converged {time.time() - began:.0f} s after the start")
        rep = get_json(nodes[0].mesh_port, "/status")["inventory"]["replication"]
        assert rep["factor"] == 2 and set(rep["own_held_by"]) == {"n1", "n2"}
        assert rep["own_held_by"]["n1"] + rep["own_held_by"]["n2"] >= rep["own"]
        code, metrics = nodes[0].health("/metrics")
        assert code == 200 and b'mesh_games_under_replicated{node="n0"} 0.0' in metrics

    # Each game once per node, every game of the cluster somewhere.
    union: set[str] = set()
    for files in nodes:
        with ReplayDB(files.data_dir / "games.db") as db:
            uids = db.uids()
            assert len(uids) == len(set(uids)) and db.integrity_problems() == []
            union |= set(uids)
    assert union == created
