"""Opening one of our stores (replay DB, rollout store, model registry): a file path or a
database URL, its tables created, its schema version checked. One opener, so every store
refuses a missing file, a foreign database and a newer schema the same way, naming the store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, MetaData, String, inspect, text
from sqlalchemy.exc import DatabaseError, OperationalError

from app.db.engines import display_name, first_line, is_url, open_engine
from app.db.sqlite_files import create_tables, stored_schema_version


@dataclass(frozen=True)
class StoreSchema:
    """What a store is called in errors and where its schema version lives."""

    what: str  # "replay DB": "<path>: replay DB not found"
    error: type[Exception]
    metadata: MetaData
    version_row: type  # the key/value table that holds the version
    version_key: str
    version: int  # this program's schema version


def open_store(path: str | Path, schema: StoreSchema, create: bool = True,
               readonly: bool = False) -> tuple[Path | str, Engine]:
    """(the name to show for `path`, its engine). A read-only open creates nothing and needs a
    version row; a newer schema than this program's is refused rather than risk the data."""
    shown: Path | str = display_name(path) if is_url(path) else Path(path)
    if isinstance(shown, Path) and not shown.exists() and (not create or readonly):
        raise schema.error(f"{shown}: {schema.what} not found")
    try:
        engine = open_engine(path, readonly=readonly)
    except ValueError as exc:
        raise schema.error(str(exc)) from None
    try:
        if not readonly:
            create_tables(schema.metadata, engine)
            widen_columns(schema.metadata, engine)
        version = stored_schema_version(engine, schema.version_row, schema.version_key, schema.version,
                                        create=not readonly)
    except (DatabaseError, OperationalError) as exc:
        engine.dispose()
        raise schema.error(f"{shown}: not a usable {schema.what}: {first_line(exc.orig)}") from None
    if version is None and readonly:
        engine.dispose()
        raise schema.error(f"{shown}: no schema version: not a {schema.what}")
    if version is not None and version > schema.version:
        engine.dispose()
        raise schema.error(f"{shown}: {schema.what} schema version {version} is newer than this program's "
                           f"({schema.version}); upgrade the program rather than risk the data")
    return shown, engine


_widened: set[tuple[str, str]] = set()  # (database, metadata) this process already checked


def widen_columns(metadata: MetaData, engine: Engine) -> list[str]:
    """PostgreSQL enforces a varchar's length (SQLite ignores it): a column that an older
    version of this program created narrower than the table now declares (varchar(64) where
    the model says text) is widened in place, so a database made before the change takes the
    long values too. Idempotent, checked once per database and process; returns what it altered."""
    if engine.dialect.name != "postgresql":
        return []
    key = (engine.url.render_as_string(hide_password=True), ",".join(sorted(metadata.tables)))
    if key in _widened:
        return []
    altered = []
    inspector = inspect(engine)
    with engine.begin() as conn:
        for table in metadata.tables.values():
            stored = {c["name"]: c["type"] for c in inspector.get_columns(table.name)}
            for column in table.columns:
                now = stored.get(column.name)
                if not isinstance(now, String) or now.length is None or not isinstance(column.type, String):
                    continue
                want = column.type.length
                if want is None or want > now.length:
                    type_sql = "TEXT" if want is None else f"VARCHAR({want})"
                    conn.execute(text(f'ALTER TABLE "{table.name}" ALTER COLUMN "{column.name}" TYPE {type_sql}'))
                    altered.append(f"{table.name}.{column.name}")
    _widened.add(key)
    return altered


def parent_child_problems(engine: Engine, parent: str, count_column: str, child: str, foreign_key: str,
                          child_key: str, parent_word: str, child_word: str) -> list[str]:
    """Empty when the file is sound (SQLite's integrity check), every `parent` row holds
    exactly the `count_column` children it records, and no `child` row lost its parent (the
    stores write a parent and its children in one transaction, so any of these is damage)."""
    problems: list[str] = []
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            result = conn.execute(text("PRAGMA integrity_check")).scalar()
            if result != "ok":
                problems.append(f"sqlite integrity_check: {result}")
        bad = conn.execute(text(
            f"SELECT p.uid, p.{count_column}, COUNT(c.{child_key}) FROM {parent} p "
            f"LEFT JOIN {child} c ON c.{foreign_key} = p.id GROUP BY p.id HAVING COUNT(c.{child_key}) != p.{count_column}"
        )).all()
        problems += [f"{parent_word} {uid}: {n} {child_word}s stored, {want} recorded" for uid, want, n in bad]
        orphans = conn.execute(text(
            f"SELECT COUNT(*) FROM {child} WHERE {foreign_key} NOT IN (SELECT id FROM {parent})")).scalar()
        if orphans:
            problems.append(f"{orphans} {child_word}s without a {parent_word}")
    return problems
