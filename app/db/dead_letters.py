"""Persisted dead-letter queue: event deliveries that failed, with their retry schedule.

Kept in SQLite (WAL) through SQLAlchemy so a node restart keeps every pending retry and the
history of abandoned ones. Methods are synchronous and short; async callers run them in a
thread. Rows are returned as frozen dataclasses, never live ORM objects, so they can cross
threads and outlive the session.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Float, Index, Integer, String, Text, create_engine, event, func, select
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker


class DeadLetterStatus(str, enum.Enum):
    PENDING = "pending"  # waiting for its next retry
    DELIVERED = "delivered"  # a retry succeeded
    ABANDONED = "abandoned"  # retries exhausted; kept for operators


class DeadLetterBase(DeclarativeBase):
    pass


class DeadLetterRow(DeadLetterBase):
    __tablename__ = "dead_letters"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    event_type: Mapped[str] = mapped_column(String(64))
    event_key: Mapped[str] = mapped_column(String(64))  # sha256 of type + canonical payload
    payload_json: Mapped[str] = mapped_column(Text)
    handler: Mapped[str] = mapped_column(Text)  # a handler's module.qualname: no bound of ours
    error: Mapped[str] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16), default=DeadLetterStatus.PENDING.value)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    next_retry_at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("ix_dead_letters_due", "status", "next_retry_at"),
        Index("ix_dead_letters_key_handler", "event_key", "handler"),
    )


@dataclass(frozen=True)
class DeadLetter:
    id: int
    event_type: str
    event_key: str
    payload_json: str
    handler: str
    error: str
    attempts: int
    status: DeadLetterStatus
    created_at: float
    updated_at: float
    next_retry_at: float


def _snapshot(row: DeadLetterRow) -> DeadLetter:
    return DeadLetter(
        id=row.id,
        event_type=row.event_type,
        event_key=row.event_key,
        payload_json=row.payload_json,
        handler=row.handler,
        error=row.error,
        attempts=row.attempts,
        status=DeadLetterStatus(row.status),
        created_at=row.created_at,
        updated_at=row.updated_at,
        next_retry_at=row.next_retry_at,
    )


class DeadLetterStore:
    """One SQLite file holding the dead-letter table."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._engine = create_engine(
            f"sqlite:///{self.path}", connect_args={"check_same_thread": False, "timeout": 30}
        )
        event.listen(self._engine, "connect", _sqlite_pragmas)
        DeadLetterBase.metadata.create_all(self._engine)
        self._sessions = sessionmaker(self._engine, expire_on_commit=False)

    def add(
        self,
        *,
        event_type: str,
        event_key: str,
        payload_json: str,
        handler: str,
        error: str,
        now: float,
        next_retry_at: float,
    ) -> DeadLetter:
        """Record a failed delivery (attempt 1). The same pending (event, handler) pair is
        recorded once: a second failure of it updates the row instead of adding another."""
        with self._sessions.begin() as session:
            row = session.scalars(
                select(DeadLetterRow).where(
                    DeadLetterRow.event_key == event_key,
                    DeadLetterRow.handler == handler,
                    DeadLetterRow.status == DeadLetterStatus.PENDING.value,
                )
            ).first()
            if row is None:
                row = DeadLetterRow(
                    event_type=event_type,
                    event_key=event_key,
                    payload_json=payload_json,
                    handler=handler,
                    error=error,
                    attempts=1,
                    status=DeadLetterStatus.PENDING.value,
                    created_at=now,
                    updated_at=now,
                    next_retry_at=next_retry_at,
                )
                session.add(row)
            else:
                row.error, row.updated_at, row.next_retry_at = error, now, next_retry_at
            session.flush()
            return _snapshot(row)

    def due(self, now: float, limit: int = 100) -> list[DeadLetter]:
        """Pending letters whose retry time has come, oldest schedule first."""
        with self._sessions() as session:
            rows = session.scalars(
                select(DeadLetterRow)
                .where(DeadLetterRow.status == DeadLetterStatus.PENDING.value, DeadLetterRow.next_retry_at <= now)
                .order_by(DeadLetterRow.next_retry_at, DeadLetterRow.id)
                .limit(limit)
            ).all()
            return [_snapshot(r) for r in rows]

    def record_success(self, letter_id: int, now: float) -> DeadLetter:
        return self._update(letter_id, now, status=DeadLetterStatus.DELIVERED, bump=True)

    def record_failure(
        self, letter_id: int, *, error: str, now: float, next_retry_at: float, abandon: bool
    ) -> DeadLetter:
        status = DeadLetterStatus.ABANDONED if abandon else DeadLetterStatus.PENDING
        return self._update(letter_id, now, status=status, bump=True, error=error, next_retry_at=next_retry_at)

    def _update(
        self,
        letter_id: int,
        now: float,
        *,
        status: DeadLetterStatus,
        bump: bool,
        error: str | None = None,
        next_retry_at: float | None = None,
    ) -> DeadLetter:
        with self._sessions.begin() as session:
            row = session.get(DeadLetterRow, letter_id)
            if row is None:
                raise KeyError(f"no dead letter with id {letter_id}")
            row.status, row.updated_at = status.value, now
            if bump:
                row.attempts += 1
            if error is not None:
                row.error = error
            if next_retry_at is not None:
                row.next_retry_at = next_retry_at
            session.flush()
            return _snapshot(row)

    def letters(self, status: DeadLetterStatus | None = None) -> list[DeadLetter]:
        with self._sessions() as session:
            query = select(DeadLetterRow).order_by(DeadLetterRow.id)
            if status is not None:
                query = query.where(DeadLetterRow.status == status.value)
            return [_snapshot(r) for r in session.scalars(query).all()]

    def counts(self) -> dict[DeadLetterStatus, int]:
        with self._sessions() as session:
            rows = session.execute(
                select(DeadLetterRow.status, func.count()).group_by(DeadLetterRow.status)
            ).all()
        counts = {s: 0 for s in DeadLetterStatus}
        counts.update({DeadLetterStatus(status): n for status, n in rows})
        return counts

    def close(self) -> None:
        self._engine.dispose()


def _sqlite_pragmas(dbapi_connection, _record) -> None:  # type: ignore[no-untyped-def]
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
