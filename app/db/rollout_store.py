"""RolloutStore: the LM workload's self-play records, one scored group of completions per row.

What a replay DB is to board games, this is to rollouts: a group and all its samples
go in one transaction and a group's uid is unique, so a writer killed at any moment leaves
the whole group or nothing, and a group synced again from a peer is never stored twice.
WAL lets the export read while self-play writes. Tokens, masks and log-probs are stored as
little-endian arrays (int32, uint8, float64: lossless for any engine's float), the
per-sample facts that filters and reports query (reward, weight version, finish and
truncation) as columns.

The records are app/db/rollout_records.py's (re-exported here).
"""

from __future__ import annotations

import json
import time
from collections.abc import Container, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sqlalchemy import Boolean, Float, ForeignKey, Integer, LargeBinary, String, Text, func, insert, select
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from app.db.rollout_records import RolloutGroupRecord, RolloutSampleRecord
from app.db.versioned_store import StoreSchema, open_store, parent_child_problems

SCHEMA_VERSION = 1
_TOKENS, _MASK, _LOGPROBS = np.dtype("<i4"), np.dtype("u1"), np.dtype("<f8")
__all__ = ["RolloutGroupRecord", "RolloutSampleRecord", "RolloutStore", "RolloutStoreError"]


class RolloutStoreError(RuntimeError):
    """A rollout store that cannot be used: missing, locked, corrupt or too new; names the path."""


class Base(DeclarativeBase):
    pass


class RolloutSchemaInfo(Base):
    __tablename__ = "rollout_schema_info"  # apart from the replay DB's: one PostgreSQL DB may hold both
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class RolloutGroupRow(Base):
    __tablename__ = "rollout_groups"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    node_id: Mapped[str] = mapped_column(String(128), index=True)
    task: Mapped[str] = mapped_column(String(64))
    prompt_id: Mapped[str] = mapped_column(String(256), index=True)
    prompt_tokens: Mapped[bytes] = mapped_column(LargeBinary)
    weight_version: Mapped[int] = mapped_column(Integer, index=True)
    model_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    n_samples: Mapped[int] = mapped_column(Integer)
    reward_mean: Mapped[float] = mapped_column(Float)
    truncated_samples: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    inserted_at: Mapped[float] = mapped_column(Float)
    samples: Mapped[list[RolloutSampleRow]] = relationship(
        back_populates="group_row", order_by="RolloutSampleRow.group_index", cascade="all, delete-orphan")


class RolloutSampleRow(Base):
    __tablename__ = "rollout_samples"
    group_id: Mapped[int] = mapped_column(ForeignKey("rollout_groups.id", ondelete="CASCADE"), primary_key=True)
    group_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    reward: Mapped[float] = mapped_column(Float)
    weight_version: Mapped[int] = mapped_column(Integer)
    finish_reason: Mapped[str] = mapped_column(String(16))
    terminated: Mapped[bool] = mapped_column(Boolean)
    truncated: Mapped[bool] = mapped_column(Boolean)
    truncation_reason: Mapped[str | None] = mapped_column(String(16), nullable=True)
    response_tokens: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes] = mapped_column(LargeBinary)
    rollout_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    metadata_json: Mapped[str] = mapped_column(Text, default="{}")
    group_row: Mapped[RolloutGroupRow] = relationship(back_populates="samples")


class RolloutDroppedRow(Base):
    """A group that self-play played and the rollout filter dropped (with why): it is settled,
    so a restarted batch does not play it again, and the counts by reason survive restarts.
    Never replicated: what a node dropped is its own business."""

    __tablename__ = "rollout_dropped"
    uid: Mapped[str] = mapped_column(String(64), primary_key=True)
    node_id: Mapped[str] = mapped_column(String(128), index=True)
    prompt_id: Mapped[str] = mapped_column(String(256))
    reason: Mapped[str] = mapped_column(String(32), index=True)
    weight_version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float, index=True)


def _pack(values: Sequence[float] | Sequence[int], dtype: np.dtype) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()


def _unpack(raw: bytes, dtype: np.dtype) -> list:
    return np.frombuffer(raw, dtype=dtype).tolist()


def _to_values(record: RolloutGroupRecord, now: float) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Column values of the group row and of its sample rows (Core inserts: the ORM's unit of
    work costs more than the SQL here)."""
    group = dict(
        uid=record.uid, node_id=record.node_id, task=record.task, prompt_id=record.prompt_id,
        prompt_tokens=_pack(record.prompt_tokens, _TOKENS), weight_version=record.weight_version,
        model_sha256=record.model_sha256, n_samples=len(record.samples),
        reward_mean=sum(record.rewards) / len(record.samples),
        truncated_samples=sum(s.truncated for s in record.samples), created_at=record.created_at, inserted_at=now)
    samples = [dict(
        group_index=s.group_index, reward=s.reward, weight_version=s.weight_version,
        finish_reason=s.finish_reason, terminated=s.terminated, truncated=s.truncated,
        truncation_reason=s.truncation_reason, response_tokens=_pack(s.response_tokens, _TOKENS),
        loss_mask=_pack(s.loss_mask, _MASK), rollout_logprobs=_pack(s.rollout_logprobs, _LOGPROBS),
        metadata_json=json.dumps(s.metadata, sort_keys=True)) for s in record.samples]
    return group, samples


def _to_record(row: RolloutGroupRow) -> RolloutGroupRecord:
    return RolloutGroupRecord(
        uid=row.uid, node_id=row.node_id, task=row.task, prompt_id=row.prompt_id,
        prompt_tokens=_unpack(row.prompt_tokens, _TOKENS), weight_version=row.weight_version,
        model_sha256=row.model_sha256, created_at=row.created_at,
        samples=[RolloutSampleRecord(
            group_index=s.group_index, response_tokens=_unpack(s.response_tokens, _TOKENS),
            loss_mask=_unpack(s.loss_mask, _MASK), rollout_logprobs=_unpack(s.rollout_logprobs, _LOGPROBS),
            reward=s.reward, weight_version=s.weight_version, finish_reason=s.finish_reason,
            terminated=s.terminated, truncated=s.truncated, truncation_reason=s.truncation_reason,
            metadata=json.loads(s.metadata_json)) for s in row.samples])


ROLLOUT_SCHEMA = StoreSchema("rollout store", RolloutStoreError, Base.metadata, RolloutSchemaInfo, "schema_version",
                             SCHEMA_VERSION)


class RolloutStore:
    """One SQLite file (or database URL) of rollout groups; one writer process, many readers."""

    def __init__(self, path: str | Path, create: bool = True, readonly: bool = False) -> None:
        self.path, self.engine = open_store(path, ROLLOUT_SCHEMA, create, readonly)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> RolloutStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -------------------------------------------------------------------------
    def add_group(self, record: RolloutGroupRecord) -> bool:
        """Insert one group with its samples atomically; False when its uid is already stored."""
        group, samples = _to_values(record, time.time())
        try:
            with self.engine.begin() as conn:  # one transaction: the group and its samples, or nothing
                if conn.scalar(select(RolloutGroupRow.id).where(RolloutGroupRow.uid == record.uid)) is not None:
                    return False
                group_id = conn.execute(insert(RolloutGroupRow).values(**group)).inserted_primary_key[0]
                conn.execute(insert(RolloutSampleRow), [{**v, "group_id": group_id} for v in samples])
        except IntegrityError:
            return False  # a concurrent writer inserted the same uid first
        except OperationalError as exc:
            raise RolloutStoreError(f"{self.path}: write failed: {exc.orig}") from None
        return True

    def add_groups(self, records: Iterable[RolloutGroupRecord]) -> int:
        """Each group in its own transaction; how many were new."""
        return sum(self.add_group(r) for r in records)

    def add_dropped(self, uid: str, node_id: str, prompt_id: str, reason: str, weight_version: int,
                    created_at: float) -> bool:
        """Record a dropped group; False when its uid is already settled."""
        try:
            with self.engine.begin() as conn:
                if conn.scalar(select(RolloutDroppedRow.uid).where(RolloutDroppedRow.uid == uid)) is not None:
                    return False
                conn.execute(insert(RolloutDroppedRow).values(uid=uid, node_id=node_id, prompt_id=prompt_id,
                                                              reason=reason, weight_version=weight_version,
                                                              created_at=created_at))
        except IntegrityError:
            return False
        except OperationalError as exc:
            raise RolloutStoreError(f"{self.path}: write failed: {exc.orig}") from None
        return True

    # -- reading -------------------------------------------------------------------------
    def count(self, node_id: str | None = None) -> int:
        stmt = select(func.count(RolloutGroupRow.id))
        if node_id is not None:
            stmt = stmt.where(RolloutGroupRow.node_id == node_id)
        with Session(self.engine) as session:
            return int(session.scalar(stmt) or 0)

    def max_id(self) -> int:
        with Session(self.engine) as session:
            return int(session.scalar(select(func.coalesce(func.max(RolloutGroupRow.id), 0))) or 0)

    def uids(self, after_id: int = 0) -> list[str]:
        """Stored uids in insertion order (optionally only rows with id > after_id)."""
        with Session(self.engine) as session:
            return list(session.scalars(
                select(RolloutGroupRow.uid).where(RolloutGroupRow.id > after_id).order_by(RolloutGroupRow.id)))

    def uids_since_version(self, min_version: int, limit: int) -> list[str]:
        """Up to `limit` uids of groups at weight version >= `min_version` (cheap: no samples)."""
        stmt = select(RolloutGroupRow.uid).where(RolloutGroupRow.weight_version >= min_version).limit(limit)
        with Session(self.engine) as session:
            return list(session.scalars(stmt))

    def held(self, uids: Sequence[str]) -> set[str]:
        """Which of `uids` are stored."""
        found: set[str] = set()
        with Session(self.engine) as session:
            for i in range(0, len(uids), 500):
                found.update(session.scalars(
                    select(RolloutGroupRow.uid).where(RolloutGroupRow.uid.in_(list(uids[i:i + 500])))))
        return found

    def settled(self, uids: Sequence[str]) -> set[str]:
        """Which of `uids` are stored or were dropped by the filter: nothing left to play."""
        found = self.held(uids)
        with Session(self.engine) as session:
            for i in range(0, len(uids), 500):
                found.update(session.scalars(
                    select(RolloutDroppedRow.uid).where(RolloutDroppedRow.uid.in_(list(uids[i:i + 500])))))
        return found

    def count_settled(self, node_id: str) -> int:
        """`node_id`'s stored groups plus the groups it dropped (self-play's batch counter)."""
        stmt = select(func.count(RolloutDroppedRow.uid)).where(RolloutDroppedRow.node_id == node_id)
        with Session(self.engine) as session:
            dropped = session.scalar(stmt)
        return self.count(node_id) + int(dropped or 0)

    def dropped_counts(self, node_id: str | None = None, since: float | None = None) -> dict[str, int]:
        """Dropped groups by reason (of one node; created at or after `since`)."""
        stmt = select(RolloutDroppedRow.reason, func.count(RolloutDroppedRow.uid)).group_by(RolloutDroppedRow.reason)
        if node_id is not None:
            stmt = stmt.where(RolloutDroppedRow.node_id == node_id)
        if since is not None:
            stmt = stmt.where(RolloutDroppedRow.created_at >= since)
        with Session(self.engine) as session:
            return {reason: int(n) for reason, n in session.execute(stmt)}

    def groups(self, uids: Sequence[str] | None = None, newest: int | None = None,
               min_version: int | None = None) -> list[RolloutGroupRecord]:
        return list(self.iter_groups(uids=uids, newest=newest, min_version=min_version))

    def iter_groups(self, uids: Sequence[str] | None = None, newest: int | None = None,
                    min_version: int | None = None) -> Iterator[RolloutGroupRecord]:
        """Groups by uid, or the `newest` N stored (oldest first), or all; `min_version` keeps
        only groups whose oldest sample is at least that weight version (a staleness bound)."""
        stmt = select(RolloutGroupRow).order_by(RolloutGroupRow.id)
        if uids is not None:
            stmt = stmt.where(RolloutGroupRow.uid.in_(list(uids)))
        if min_version is not None:
            stmt = stmt.where(RolloutGroupRow.weight_version >= min_version)
        if newest is not None:
            stmt = stmt.order_by(None).order_by(RolloutGroupRow.id.desc()).limit(newest)
        with Session(self.engine) as session:
            rows = list(session.scalars(stmt))
            if newest is not None:
                rows.reverse()
            for row in rows:
                yield _to_record(row)

    def groups_of_models(self, model_sha256s: Sequence[str], exclude: Container[str] = (),
                         limit: int = 256) -> list[RolloutGroupRecord]:
        """Up to `limit` groups made by any of these weights (oldest first), skipping the uids in
        `exclude`: the online trainer's read of its rollout workers' groups (remote_groups.py)."""
        if not model_sha256s:
            return []
        stmt = select(RolloutGroupRow).where(RolloutGroupRow.model_sha256.in_(list(model_sha256s))) \
            .order_by(RolloutGroupRow.id)
        out: list[RolloutGroupRecord] = []
        with Session(self.engine) as session:
            for row in session.scalars(stmt):
                if row.uid in exclude:
                    continue
                out.append(_to_record(row))
                if len(out) >= limit:
                    break
        return out

    def integrity_problems(self) -> list[str]:
        """Empty when the file is sound and every group holds exactly its recorded samples."""
        return parent_child_problems(self.engine, "rollout_groups", "n_samples", "rollout_samples", "group_id",
                                     "group_index", "group", "sample")
