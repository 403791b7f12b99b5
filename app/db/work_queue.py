"""SQLAlchemy model of the leader's work queue (one SQLite file per node).

Only the current leader writes it; after a leader change the new leader rebuilds its rows
from replicated state, so this file is a cache of the leader's decisions, not the truth: a file
of an older layout is dropped and rebuilt rather than migrated. Terms and sequence numbers are
bounded by the wire schema (2**53), well inside a 64-bit integer (BigInteger: PostgreSQL's
INTEGER is 32-bit). `expires_at` is on
the leader's monotonic clock.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import (
    JSON,
    BigInteger,
    Float,
    Integer,
    String,
    UniqueConstraint,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.db.engines import is_url, open_engine
from app.db.sqlite_files import create_tables

PENDING = "pending"
CLAIMED = "claimed"
DONE = "done"
FAILED = "failed"  # attempts exhausted; stays here so it is not re-queued


class Base(DeclarativeBase):
    pass


class WorkItemRow(Base):
    __tablename__ = "work_items"
    __table_args__ = (UniqueConstraint("kind", "key"),)

    item_id: Mapped[str] = mapped_column(String(512), primary_key=True)  # "kind:key"
    kind: Mapped[str] = mapped_column(String(64), index=True)
    key: Mapped[str] = mapped_column(String(440))
    payload: Mapped[dict] = mapped_column(JSON, default=dict)
    requirements: Mapped[dict] = mapped_column(JSON, default=dict)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    ttl: Mapped[float | None] = mapped_column(Float, nullable=True)
    state: Mapped[str] = mapped_column(String(16), default=PENDING, index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    claim_term: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    claim_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    claimed_by: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # the token of an earlier leader this claim was adopted from (its holder's next renew swaps it)
    adopted_term: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    adopted_seq: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float, default=0.0)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_error: Mapped[str] = mapped_column(String(4096), default="")
    # the claimant's signed completion that made the item done (schemas.Completion), gossiped by the leader
    completion: Mapped[dict | None] = mapped_column(JSON, nullable=True)


def make_engine(path: Path | str) -> Engine:
    if is_url(path):  # a database URL, e.g. PostgreSQL (app/db/engines.py)
        return _create_tables(open_engine(path))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(f"sqlite:///{path}", future=True)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_conn, _record) -> None:  # type: ignore[no-untyped-def]
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    return _create_tables(engine)


def _create_tables(engine: Engine) -> Engine:
    columns = {c["name"] for c in inspect(engine).get_columns(WorkItemRow.__tablename__)} \
        if inspect(engine).has_table(WorkItemRow.__tablename__) else None
    if columns is not None and columns != set(WorkItemRow.__table__.columns.keys()):
        WorkItemRow.__table__.drop(engine)  # an older layout: a cache, rebuilt by the leader
    create_tables(Base.metadata, engine)
    return engine
