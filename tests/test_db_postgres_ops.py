"""A node's database on a real PostgreSQL server, as operators meet it: a fresh database opened
by many processes at once leaves no ERROR in the server's log; a snapshot of a PostgreSQL node
restores into a new database, or into SQLite files, with the same games, models and best."""

from __future__ import annotations

import json
import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from app.cli.snapshot import SnapshotError, restore, save, summarize
from app.config.paths import NodePaths
from app.coordination.p2p.work_queue import WorkQueue
from app.db.registry import ModelRegistry
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.db.rollout_store import RolloutStore

pytestmark = pytest.mark.timeout(180)


def open_every_store(url: str) -> None:
    """What one node's processes do on a fresh database: open each store (tables, version row)."""
    ReplayDB(url).close()
    ModelRegistry(url).close()
    RolloutStore(url).close()
    WorkQueue(url, max_attempts=2, default_ttl=5.0).close()


def test_a_concurrent_fresh_start_leaves_no_error_in_the_server_log(postgres_server) -> None:
    url = postgres_server.create_database()
    log = postgres_server.root / "server.log"
    start = log.stat().st_size
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=open_every_store, args=(url,)) for _ in range(6)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(120)
        assert proc.exitcode == 0
    with open(log, "rb") as fh:
        fh.seek(start)
        errors = [line for line in fh.read().decode(errors="replace").splitlines() if "ERROR" in line]
    assert errors == [], "\n".join(errors[:10])
    with ReplayDB(url) as games, ModelRegistry(url) as registry:
        assert games.count() == 0 and registry.models() == []


def seed_pg_node(url: str, data_dir: Path) -> str:
    sha = "ab" * 32
    (data_dir / "models").mkdir(parents=True)
    (data_dir / "models" / f"{sha}.safetensors").write_bytes(b"weights")
    with ReplayDB(url) as games:
        games.add_games(GameRecord(uid=f"g{i}", game="connect4", moves=[MoveRecord(3, [1 / 7] * 7, 0.0)],
                                   winner=i % 2, node_id="pg") for i in range(25))
    with ModelRegistry(url) as registry:
        registry.register(sha, data_dir / "models" / f"{sha}.safetensors", 1)
        registry.promote(sha, "seeded")
    (data_dir / "pipeline_state.json").write_text(json.dumps({"generation": 2, "stage": "collecting",
                                                              "best_sha256": sha, "best_generation": 1}))
    (data_dir / "mesh_term.json").write_text('{"term": 7}')
    return sha


def test_a_postgresql_node_restores_into_a_new_database_or_sqlite(postgres_server, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    sha = seed_pg_node(url, tmp_path / "node")
    archive = tmp_path / "pg.snap"
    manifest = save(NodePaths(tmp_path / "node", url), archive, node_id="pg")
    assert manifest["database"] == "postgresql" and manifest["summary"]["games"]["count"] == 25
    assert manifest["summary"]["best_sha256"] == sha and "games.db" in manifest["files"]

    fresh = postgres_server.create_database()
    restore(archive, tmp_path / "restored_pg", fresh)
    assert not (tmp_path / "restored_pg" / "games.db").exists()  # the stores went into the database
    assert (tmp_path / "restored_pg" / "mesh_term.json").read_text() == '{"term": 7}'
    with ReplayDB(fresh) as games, ModelRegistry(fresh) as registry:
        assert games.count() == 25
        games.add_game(GameRecord(uid="after", game="connect4", moves=[MoveRecord(3, [1 / 7] * 7, 0.0)],
                                  winner=None, node_id="pg"))  # the id sequence moved past the copied rows
        best = registry.current_best()
        assert best is not None and best.sha256 == sha
        assert best.path == str(tmp_path / "restored_pg" / "models" / f"{sha}.safetensors")  # rebased
    with pytest.raises(SnapshotError, match="not empty"):
        restore(archive, tmp_path / "again", fresh)  # never over a node's database
    assert not (tmp_path / "again").exists()

    restore(archive, tmp_path / "restored_sqlite")  # across backends: SQLite files
    assert summarize(tmp_path / "restored_sqlite") == manifest["summary"]
    with sqlite3.connect(tmp_path / "restored_sqlite" / "registry.db") as db:
        assert db.execute("SELECT path FROM models").fetchone()[0] == f"models/{sha}.safetensors"
