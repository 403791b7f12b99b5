"""A whole cluster as operators run it, on both storage backends at once: three real nodes, two on
a PostgreSQL database of their own and one on SQLite files (a team's machines need not agree on
storage), train and decide at least two generations with spread gauntlets; then what operators
read is checked on every node: the dashboard JSON (every generation rated, with its interval;
readiness; games) and /metrics (games, the best model's install time, Elo by role, build info).
One mixed cluster rather than one cluster per backend: each backend still runs a whole node
through every stage (the leader's work queue on whichever node leads), at half the suite's time.

PostgreSQL enforces column widths that SQLite ignores: a 92-character gauntlet game uid once
stopped a PostgreSQL node at generation 2 for good while every SQLite test passed, and the
dashboard sampler failed every 5 s on a registry given by URL. Tiny networks and searches keep a
generation to seconds; the run is about storage and what operators see, not strength.
"""

from __future__ import annotations

import json
import secrets
import urllib.request

import pytest

from tests.orchestrator_helpers import (
    BUSY_CPU_TIMING,
    SMALL_DAEMONS,
    TINY_CONFIG,
    NodeFiles,
    get_json,
    start_voter,
    stop_nodes,
    tail,
    tiny_selfplay,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
GENERATIONS = 2  # the second is where a 92-character gauntlet uid once stopped a PostgreSQL node
# Training capped at a few dozen steps over a small window: a generation costs little more than
# torchrun's start, however many games self-play adds meanwhile.
CONFIG = {**TINY_CONFIG, "mesh": {"timing": BUSY_CPU_TIMING}, "train": {**TINY_CONFIG["train"], "max_steps": 30},
          "export": {"window_games": 300, "window_base_games": 0}}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": {**tiny_selfplay(16), "settings": {**tiny_selfplay(16)["settings"], "rest_s": 3.0}},
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5, "sync_budget_s": 20}},
    "gauntlet_shards": {"settings": {"poll_s": 0.5}},
    "replication": {},
}}


def metrics(files: NodeFiles) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{files.health_port}/metrics", timeout=3) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def decided(files: NodeFiles) -> list[dict]:
    progress = get_json(files.mesh_port, "/progress") or {}
    return progress.get("generations", [])


POSTGRES_NODES = IDS[:2]  # a PostgreSQL database of its own each; the last node keeps SQLite files


@pytest.mark.timeout(900)
def test_three_nodes_on_both_backends_decide_generations_and_operators_see_them(postgres_server, tmp_path,
                                                                              monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = [write_node_files(tmp_path / nid, nid, CONFIG, DAEMONS) for nid in IDS]
    extra = [["--db-url", postgres_server.create_database()] if nid in POSTGRES_NODES else [] for nid in IDS]
    procs = {nid: start_voter(nodes, IDS, i, *extra[i]) for i, nid in enumerate(IDS)}
    try:
        wait_until(lambda: all(len(decided(f)) >= GENERATIONS for f in nodes), 780, interval=1.0,
                   what=f"{GENERATIONS} decided generations on every node")
        for files in nodes:  # nothing went to SQLite files behind a database's back, and SQLite is used
            on_files = {name for name in ("games.db", "registry.db") if (files.data_dir / name).exists()}
            assert on_files == (set() if files.root.name in POSTGRES_NODES else {"games.db", "registry.db"}), \
                (files.root.name, on_files)

        def rated_everywhere() -> list[dict] | None:
            """The dashboard of every node: the same generations, each rated with its interval."""
            views = [get_json(f.health_port, "/dashboard.json") for f in nodes]
            if not all(views):
                return None
            gens = [[g for g in v["generations"] if g["generation"] <= GENERATIONS] for v in views]
            if not all(len(g) == GENERATIONS and all(x["elo"] is not None and x["elo_low"] is not None for x in g)
                       for g in gens):
                return None
            ratings = [[(x["sha256"], round(x["elo"], 6)) for x in g] for g in gens]
            return views if all(r == ratings[0] for r in ratings) else None

        views = wait_until(rated_everywhere, 60, interval=1.0, what="every generation rated alike on every node")
        for view in views:
            assert "error" not in view, view["error"]
            assert view["cluster"]["quorum_level"] == "healthy" and view["cluster"]["voters_not_ready"] == []
            assert all(n["ready"] is True and n["health"] == "alive" for n in view["nodes"]), view["nodes"]
            assert sum(n["games"] or 0 for n in view["nodes"]) > 0 and view["series"]
            for g in view["generations"][:GENERATIONS]:
                assert g["elo_low"] <= g["elo"] <= g["elo_high"], g

        def scraped() -> bool:
            texts = [metrics(f) for f in nodes]
            want = ("mesh_best_model_installed_timestamp_seconds{", 'mesh_model_elo{node="', 'role="best"',
                    'role="candidate"', "mesh_build_info{", "process_cpu_seconds_total{")
            games = [next((float(line.split()[-1]) for line in t.splitlines()
                           if line.startswith("mesh_cluster_games_created{")), 0.0) for t in texts]
            return all(all(w in t for w in want) for t in texts) and all(g > 0 for g in games)

        wait_until(scraped, 60, interval=1.0, what="every node's /metrics with games, the best's install time and Elo")
        for files in nodes:  # Elo by role: two series, not one per generation
            elo = [line for line in metrics(files).splitlines() if line.startswith("mesh_model_elo{")]
            assert len(elo) == 2, elo
            assert get_json(files.health_port, "/readyz") == {"ready": True, "reason": "ready"}
    except AssertionError:
        for files in nodes:
            print(f"--- {files.root.name}\n{tail(files, 4000)}")
            state = files.data_dir / "pipeline_state.json"
            print(json.dumps(json.loads(state.read_text()) if state.exists() else {})[:1000])
        raise
    finally:
        stop_nodes(procs.values(), timeout=35)
