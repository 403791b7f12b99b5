"""Where a store's tables live: an SQLite file (the default) or a database URL.

The registry, the replay store and the work queue take either a path (one SQLite file, WAL,
created on first use) or a URL such as `postgresql+psycopg://user@host:5432/mesh` for teams
that outgrow SQLite. The three stores' tables have distinct names, so one PostgreSQL database
per node holds all three (`--db-url`); two nodes never share one (each node's replay store and
work queue are its own).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from app.db.sqlite_files import set_sqlite_pragmas

SUPPORTED = ("postgresql", "sqlite")
CONNECT_TIMEOUT_S = 10  # a server that never answers is an error within this, not a hang


def is_url(target: str | Path) -> bool:
    return isinstance(target, str) and "://" in target


def display_name(target: str | Path) -> str:
    """For messages: the path, or the URL with its password hidden."""
    if is_url(target):
        try:
            return make_url(str(target)).render_as_string(hide_password=True)
        except ArgumentError:
            return "<malformed database URL>"
    return str(target)


def open_engine(target: str | Path, readonly: bool = False) -> Engine:
    """An engine for a path (SQLite, parent dirs created, pragmas set) or a database URL.
    A malformed or unsupported URL, or a missing driver, is a ValueError naming the URL."""
    if not is_url(target):
        path = Path(target)
        path.parent.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///file:{path}?mode=ro&uri=true" if readonly else f"sqlite:///{path}"
        engine = create_engine(url, future=True)
        if not readonly:
            event.listen(engine, "connect", set_sqlite_pragmas)
        return engine
    name = display_name(target)
    try:
        url = make_url(str(target))
    except ArgumentError:
        raise ValueError(f"{name}: not a database URL (expected e.g. postgresql+psycopg://user@host/db)") from None
    if url.get_backend_name() not in SUPPORTED:
        raise ValueError(f"{name}: unsupported database {url.get_backend_name()!r} (use one of {', '.join(SUPPORTED)})")
    try:
        connect_args = {"connect_timeout": CONNECT_TIMEOUT_S} if url.get_backend_name() == "postgresql" else {}
        engine = create_engine(url, future=True, pool_pre_ping=True, connect_args=connect_args)
    except ModuleNotFoundError as exc:
        raise ValueError(f"{name}: database driver missing ({exc.name}); pip install 'psycopg[binary]'") from None
    except NoSuchModuleError:
        raise ValueError(f"{name}: unknown database driver {url.drivername!r} "
                         "(use postgresql+psycopg://...)") from None
    if url.get_backend_name() == "sqlite":
        event.listen(engine, "connect", set_sqlite_pragmas)
    return engine


def check_reachable(target: str | Path) -> None:
    """Connect once to a database URL (a path needs nothing): a ValueError with one line naming
    the URL (password hidden) and the server's first line of complaint, so a node started on
    an unreachable or refused database says so at once instead of failing in a daemon later."""
    if not is_url(target):
        return
    engine = open_engine(target)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except DBAPIError as exc:
        raise ValueError(f"{display_name(target)}: cannot use the database: {first_line(exc.orig)}") from None
    finally:
        engine.dispose()


def first_line(error: BaseException) -> str:
    """A driver's message is several lines (psycopg adds hints): the first says what happened."""
    return next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
