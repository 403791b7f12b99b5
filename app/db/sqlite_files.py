"""What every SQLite file of ours shares: connection pragmas and race-safe table creation."""

from __future__ import annotations

import sqlite3

from sqlalchemy import Engine, MetaData
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError


def set_sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    """WAL so readers never block the writer; a busy timeout so writers queue, not fail."""
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute("PRAGMA busy_timeout=10000")
    cur.close()


def create_tables(metadata: MetaData, engine: Engine) -> None:
    """create_all, tolerating another process or thread creating the same tables at once
    (SQLite: "already exists"; PostgreSQL: that, or a duplicate key in its type catalogue)."""
    for attempt in range(3):
        try:
            metadata.create_all(engine)
            return
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            text = str(exc.orig)
            if ("already exists" not in text and "duplicate key" not in text) or attempt == 2:
                raise
