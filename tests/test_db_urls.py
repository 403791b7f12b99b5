"""Stores opened by database URL: one PostgreSQL database holds a node's registry, replay store
and work queue side by side; a bad URL is a clear error that never shows the password."""

from __future__ import annotations

import pytest

from app.coordination.p2p.work_queue import WorkQueue
from app.coordination.p2p.work_rules import WorkSpec
from app.db.registry import ModelRegistry, RegistryError
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB, ReplayDBError

pytestmark = pytest.mark.timeout(120)


def test_one_database_holds_all_three_stores(postgres_server) -> None:
    url = postgres_server.create_database()
    with ReplayDB(url) as games, ModelRegistry(url) as registry:
        games.add_game(GameRecord(uid="g1", game="connect4", moves=[MoveRecord(3, [1 / 7] * 7, 0.0)],
                                  winner=0, node_id="n1"))
        registry.register("ab" * 32, "/m.safetensors", 1)
        queue = WorkQueue(url, max_attempts=2, default_ttl=5.0)
        try:
            queue.rebuild(2**40, [WorkSpec("demo", "a")], [], now=0.0)  # 64-bit terms
            grant = queue.claim("w1", {}, None, term=2**40, now=1.0)
            assert grant is not None and grant.token.term == 2**40
        finally:
            queue.close()
        assert games.count() == 1 and registry.get("ab" * 32).generation == 1
    with ReplayDB(url) as again:
        assert again.uids() == ["g1"]


@pytest.mark.parametrize("url, expected", [
    ("mysql+pymysql://u:hunter2@h/db", "unsupported database 'mysql'"),
    ("postgresql+nosuchdriver://u:hunter2@h/db", "postgresql+nosuchdriver://u:***@h/db"),
])
def test_a_bad_url_is_named_without_its_password(url: str, expected: str) -> None:
    for store, error in ((ModelRegistry, RegistryError), (ReplayDB, ReplayDBError)):
        with pytest.raises(error) as info:
            store(url)
        assert expected in str(info.value) and "hunter2" not in str(info.value)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_node_runs_on_postgresql(postgres_server, tmp_path) -> None:
    """`--db-url`: the orchestrator keeps its replay store, registry and work queue there."""
    import psycopg

    from tests.ops_cluster import LIGHT_DAEMONS
    from tests.orchestrator_helpers import SMALL_CONFIG, start_node, stop_nodes, tail, wait_until, write_node_files

    url = postgres_server.create_database()
    files = write_node_files(tmp_path / "solo", "solo", SMALL_CONFIG, LIGHT_DAEMONS)
    proc = start_node(files, "--db-url", url)
    try:
        wait_until(lambda: files.health("/readyz")[0] == 200, 90, what="ready")
        dsn = url.replace("postgresql+psycopg://", "postgresql://")

        def tables() -> set[str]:
            with psycopg.connect(dsn) as conn:
                return {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        wait_until(lambda: {"games", "moves", "work_items"} <= tables(), 30, what="the node's tables in PostgreSQL")
        assert not (files.data_dir / "games.db").exists() and not (files.data_dir / "work_queue.db").exists()
        with ModelRegistry(url) as registry:  # an operator's CLI reads the same registry
            assert registry.current_best() is None
        assert "models" in tables()
    except AssertionError:
        print(tail(files))
        raise
    finally:
        stop_nodes([proc], timeout=35)


def test_an_unreachable_database_is_one_line_not_a_traceback(tmp_path) -> None:
    """The node and the registry CLI, given a PostgreSQL URL nobody answers at: exit status 2
    and one line naming the URL (password hidden) and what happened."""
    import subprocess
    import sys

    from tests.mesh_helpers import free_ports
    from tests.orchestrator_helpers import ROOT

    db_port, mesh_port, health_port = free_ports(3)
    url = f"postgresql+psycopg://mesh:hunter2@127.0.0.1:{db_port}/mesh"
    for argv in (["app.p2p_orchestrator", "--data-dir", str(tmp_path / "data"), "--db-url", url,
                  "--port", str(mesh_port), "--health-port", str(health_port)],
                 ["app.cli", "registry", "--registry", url, "list"]):
        proc = subprocess.run([sys.executable, "-m", *argv], cwd=ROOT, capture_output=True, text=True, timeout=90)
        lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("{")]
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
        assert f"127.0.0.1:{db_port}" in lines[0] and "refused" in lines[0].lower() and "hunter2" not in proc.stderr
