"""Copy a node's SQL stores between a database URL and SQLite files, table by table.

A snapshot of a PostgreSQL node is the same archive as an SQLite node's: each store's tables
copied, in one REPEATABLE READ transaction (one consistent view of the whole database), into
an SQLite file named as the SQLite node names it (games.db, registry.db, ...). Restoring copies
them back into whichever database the restored node uses. SQLAlchemy's own types carry the
rows across, so neither side needs `pg_dump` / `psql` of the server's exact version.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Integer, MetaData, Table, func, inspect, select, text

from app.db import registry_tables, replay_db, rollout_store, work_queue
from app.db.engines import open_engine
from app.db.sqlite_files import create_tables

# what a node's database URL holds, by the SQLite file an SQLite node keeps the same tables in
STORES: dict[str, MetaData] = {
    "games.db": replay_db.Base.metadata,
    "registry.db": registry_tables.RegistryBase.metadata,
    "work_queue.db": work_queue.Base.metadata,
    "rollouts.db": rollout_store.Base.metadata,
}
BATCH_ROWS = 2000


class TableCopyError(RuntimeError):
    """A database that cannot be copied from or into (named, password hidden)."""


def dump_database(url: str, out_dir: Path) -> list[str]:
    """Every store the database at `url` holds, as SQLite files in `out_dir`, from one
    consistent read. Returns the file names written."""
    engine = open_engine(url)
    written = []
    try:
        present = set(inspect(engine).get_table_names())
        with engine.connect() as src:
            if engine.dialect.name == "postgresql":
                src.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
            for name, metadata in STORES.items():
                tables = [t for t in metadata.sorted_tables if t.name in present]
                if not tables:
                    continue
                with _sqlite(out_dir / name) as dst:
                    create_tables(metadata, dst.engine)
                    for table in tables:
                        _copy_rows(src, dst, table)
                written.append(name)
    finally:
        engine.dispose()
    return written


def load_database(url: str, files: dict[str, Path]) -> int:
    """Copy the stores' SQLite files into the (empty) database at `url`; refused if any of
    their tables already holds rows there (a restore never writes over a node's data).
    Returns the rows copied."""
    engine = open_engine(url)
    copied = 0
    try:
        with engine.connect() as probe:
            present = set(inspect(engine).get_table_names())
            for name in files:
                for table in STORES[name].sorted_tables:
                    if table.name in present and probe.scalar(select(func.count()).select_from(table)):
                        raise TableCopyError(f"{engine.url.render_as_string(hide_password=True)}: table "
                                             f"{table.name} is not empty: restore into a new database")
        done: set[str] = set()  # the registry and the replay DB share `schema_info` (distinct keys)
        for name, path in files.items():
            metadata = STORES[name]
            create_tables(metadata, engine)
            with _sqlite(path) as src, engine.begin() as dst:
                for table in metadata.sorted_tables:
                    copied += _copy_rows(src, dst, table, skip_present=table.name in done)
                    done.add(table.name)
                    if engine.dialect.name == "postgresql":
                        _advance_sequence(dst, table)
    finally:
        engine.dispose()
    return copied


@contextmanager
def _sqlite(path: Path) -> Iterator[Connection]:
    engine = open_engine(path)
    try:
        with engine.begin() as conn:
            yield conn
    finally:
        engine.dispose()


def _copy_rows(src: Connection, dst: Connection, table: Table, skip_present: bool = False) -> int:
    """`skip_present`: leave out rows whose key `dst` holds already (a shared small table)."""
    present = {tuple(r) for r in dst.execute(select(*table.primary_key.columns))} if skip_present else set()
    keys = [c.name for c in table.primary_key.columns]
    result = src.execution_options(yield_per=BATCH_ROWS).execute(select(table))
    copied = 0
    for rows in result.partitions(BATCH_ROWS):
        batch = [dict(row._mapping) for row in rows]
        batch = [r for r in batch if tuple(r[k] for k in keys) not in present]
        if batch:
            dst.execute(table.insert(), batch)
        copied += len(batch)
    return copied


def _advance_sequence(conn: Connection, table: Table) -> None:
    """Rows inserted with their ids leave PostgreSQL's id sequence behind: the next insert
    would take an id already used."""
    keys = list(table.primary_key.columns)
    if len(keys) != 1 or not isinstance(keys[0].type, Integer) or keys[0].autoincrement is False:
        return
    column = keys[0].name
    sequence = conn.scalar(text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": column})
    if sequence:
        conn.execute(text(f'SELECT setval(:s, COALESCE((SELECT MAX("{column}") FROM "{table.name}"), 1), '
                          f'(SELECT MAX("{column}") FROM "{table.name}") IS NOT NULL)'), {"s": sequence})
