"""What every store of ours shares: SQLite connection pragmas, race-safe table creation and
schema-version row (SQLite: retried; PostgreSQL: serialized under an advisory lock)."""

from __future__ import annotations

import sqlite3
import time

from sqlalchemy import Connection, Engine, MetaData, text
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session


BUSY_TIMEOUT_S = 10.0


def set_sqlite_pragmas(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    """WAL so readers never block the writer; a busy timeout so writers queue, not fail."""
    cur = dbapi_conn.cursor()
    cur.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
    _enter_wal(cur)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


def _enter_wal(cur: sqlite3.Cursor) -> None:
    """Switching a file into WAL answers "database is locked" at once, without waiting on the
    busy timeout, while another connection opens the same new file (a daemon's writer and a
    reader polling it: the self-play daemon died of it). WAL is then a property of the file, so
    only a file's first connections ever retry here, briefly and within the busy timeout."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.005
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + delay > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)


SCHEMA_LOCK_KEY = 0x6D657368  # "mesh": one advisory lock for every store's schema changes


def lock_schema(conn: Connection | Session) -> None:
    """PostgreSQL: hold the schema lock until this transaction ends. Nodes and daemons opening
    a fresh database at once then create its tables and version rows one after the other; the
    check-then-create race each would otherwise lose (and recover from) left a burst of ERRORs
    in the server's log (a concurrent CREATE TABLE, a duplicate schema_info_pkey)."""
    bind = conn.get_bind() if isinstance(conn, Session) else conn
    if bind.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": SCHEMA_LOCK_KEY})


def create_tables(metadata: MetaData, engine: Engine) -> None:
    """On PostgreSQL: one transaction under the schema lock. On SQLite: create_all, tolerating other processes or threads creating the same tables at once
    (SQLite: "already exists"; PostgreSQL: that, or a duplicate key in its type catalogue).

    create_all looks, then creates what it did not see; a racer can make any one table or
    index in between. Each such loss means an object now exists that did not, so one attempt
    per table and index, plus one, always ends (three were too few for six threads opening one
    new replay DB: its tables and indexes outnumber them)."""
    if engine.dialect.name == "postgresql":  # serialized, so the server logs no lost race
        with engine.begin() as conn:
            lock_schema(conn)
            metadata.create_all(conn)
        return
    attempts = 1 + sum(1 + len(table.indexes) for table in metadata.tables.values())
    for attempt in range(attempts):
        try:
            metadata.create_all(engine)
            return
        except (OperationalError, ProgrammingError, IntegrityError) as exc:
            text = str(exc.orig)
            if ("already exists" not in text and "duplicate key" not in text) or attempt == attempts - 1:
                raise


def stored_schema_version(engine: Engine, row_type: type, key: str, current: int, create: bool) -> int | None:
    """The schema version a store's file records under `key`, writing `current` for a new file
    (None then, or when the file has none and `create` is false). Two processes opening a new
    file at once both try to insert the row; the loser's IntegrityError means the row is there
    now, so it reads again instead of failing."""
    for _ in range(2):
        try:
            with Session(engine) as session, session.begin():
                if create:
                    lock_schema(session)
                row = session.get(row_type, key)
                if row is not None:
                    return int(row.value)
                if create:
                    session.add(row_type(key=key, value=str(current)))
                return None
        except IntegrityError:
            continue
    raise IntegrityError("schema version row", None, Exception(f"{key}: could not be read or written"))
