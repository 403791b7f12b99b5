"""Storage tests run on both backends: `db_target` is an SQLite path or the URL of a fresh
database on a real PostgreSQL server this plugin starts (initdb in a temp dir, a free port,
removed after the session). Registered in conftest.py (`pytest_plugins`).

Without PostgreSQL's programs the postgresql runs skip naming the package (fail under CI).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from tests.mesh_helpers import free_ports
from tests.ops_tools import require_tool

BACKENDS = ["sqlite", "postgresql"]


class PostgresServer:
    """initdb + pg_ctl in a private directory; as root, run as the `postgres` user (initdb
    refuses root)."""

    def __init__(self, durable: bool = False) -> None:
        """`durable`: keep fsync on (benchmarks); tests turn it off for speed."""
        self.durable = durable
        self.initdb, self.pg_ctl = require_tool("initdb"), require_tool("pg_ctl")
        self.root = Path(tempfile.mkdtemp(prefix="pg-test-"))
        self.data = self.root / "data"
        [self.port] = free_ports(1)
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        self._as_user: list[str] = []
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
            self._as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *cmd: str, timeout: float = 120) -> None:
        result = subprocess.run([*self._as_user, *cmd], capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}")

    def start(self) -> None:
        self._run(self.initdb, "-D", str(self.data), "-U", self.user, "--auth=trust", "--no-sync",
                  "--encoding=UTF8", "--locale=C")
        self.started = True
        opts = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c max_connections=200"
        if not self.durable:
            opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        self._run(self.pg_ctl, "-D", str(self.data), "-l", str(self.root / "server.log"), "-o", opts, "-w",
                  "-t", "60", "start")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "-t", "30", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user={self.user} dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail("psycopg not installed: pip install 'psycopg[binary]'")
        pytest.skip("psycopg not installed (pip install 'psycopg[binary]')")
    server = PostgresServer()
    try:
        server.start()
        deadline = time.monotonic() + 30
        while True:
            try:
                server.create_database()
                break
            except Exception:  # noqa: BLE001 - accepting connections a moment after pg_ctl returns
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield server
    finally:
        server.stop()


@pytest.fixture(params=BACKENDS)
def db_target(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Per test: a fresh SQLite path (`<tmp>/store.db`) or a fresh PostgreSQL database URL."""
    if request.param == "sqlite":
        return tmp_path / "store.db"
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.create_database()
