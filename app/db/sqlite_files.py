"""What every SQLite file of ours shares: connection pragmas, race-safe table creation and
schema-version row."""

from __future__ import annotations

import sqlite3

from sqlalchemy import Engine, MetaData
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.orm import Session


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


def stored_schema_version(engine: Engine, row_type: type, key: str, current: int, create: bool) -> int | None:
    """The schema version a store's file records under `key`, writing `current` for a new file
    (None then, or when the file has none and `create` is false). Two processes opening a new
    file at once both try to insert the row; the loser's IntegrityError means the row is there
    now, so it reads again instead of failing."""
    for _ in range(2):
        try:
            with Session(engine) as session, session.begin():
                row = session.get(row_type, key)
                if row is not None:
                    return int(row.value)
                if create:
                    session.add(row_type(key=key, value=str(current)))
                return None
        except IntegrityError:
            continue
    raise IntegrityError("schema version row", None, Exception(f"{key}: could not be read or written"))
