"""The range digests of an insert-only SQL table of records, for anti-entropy replication.

Any table with an autoincrement `id`, a unique `uid` and an origin `node_id` can be replicated
(games, the LM workload's rollout groups): the digests of the fine ranges are kept in memory
per origin, updated incrementally from the rows added since the last look (the store is
insert-only and SQLite hands out row ids in commit order, so "rows with id > N" is exactly
what is new). Deeper ranges are digested from an index range scan on uid when asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from app.coordination.sync.ranges import (
    EMPTY, FINE_DEPTH, Digest, bounds, combine, digest_of, fine_under, id_hash, range_of,
)

IN_CHUNK = 500  # ids per IN (...) query


class RowIndex:
    """Thread-safe: the replication daemon and the replica server call it from worker threads."""

    def __init__(self, engine: Engine, row: Any, made_at: Any) -> None:
        self.engine, self.row, self.made_at = engine, row, made_at
        self._lock = threading.Lock()
        self._seen = 0  # row id up to which the index is current
        self._fine: dict[str, dict[str, Digest]] = {}  # origin -> fine prefix -> digest
        self._total = 0

    def refresh(self) -> None:
        """Fold rows added since the last call into the fine digests."""
        row = self.row
        with self._lock, Session(self.engine) as session:
            newest = int(session.scalar(select(func.coalesce(func.max(row.id), 0))) or 0)
            if newest < self._seen:  # the table was replaced under us: start over
                self._seen, self._fine, self._total = 0, {}, 0
            rows = session.execute(
                select(row.id, row.uid, row.node_id).where(row.id > self._seen).order_by(row.id)).all()
            for row_id, uid, origin in rows:
                fine = self._fine.setdefault(origin, {})
                prefix = range_of(uid, FINE_DEPTH)
                fine[prefix] = combine(fine.get(prefix, EMPTY), (1, id_hash(uid)))
                self._seen = row_id
            self._total += len(rows)

    def count(self) -> int:
        self.refresh()
        return self._total

    def top_digests(self) -> dict[str, Digest]:
        self.refresh()
        with self._lock:
            out: dict[str, Digest] = {}
            for origin, fine in self._fine.items():
                d = EMPTY
                for v in fine.values():
                    d = combine(d, v)
                out[origin] = d
            return out

    def digest(self, origin: str, prefix: str) -> Digest:
        if len(prefix) <= FINE_DEPTH:
            self.refresh()
            with self._lock:
                fine = self._fine.get(origin, {})
                d = EMPTY
                for p in fine_under(prefix):
                    d = combine(d, fine.get(p, EMPTY))
                return d
        return digest_of(self.ids(origin, prefix, "", None))

    def ids(self, origin: str, prefix: str, after: str, limit: int | None) -> list[str]:
        row = self.row
        lo, hi = bounds(prefix)
        stmt = select(row.uid).where(row.node_id == origin, row.uid >= lo, row.uid > after)
        if hi is not None:
            stmt = stmt.where(row.uid < hi)
        stmt = stmt.order_by(row.uid)
        if limit is not None:
            stmt = stmt.limit(limit)
        with Session(self.engine) as session:
            return list(session.scalars(stmt))

    def since(self, origin: str, after: int, limit: int) -> list[tuple[int, str, float]]:
        """(row id, uid, made at) of origin's rows with a row id above `after`, oldest first: the
        records a node made since it last looked (replica_push.py pushes them)."""
        row = self.row
        stmt = (select(row.id, row.uid, self.made_at).where(row.id > after, row.node_id == origin)
                .order_by(row.id).limit(limit))
        with Session(self.engine) as session:
            return [(int(i), str(u), float(t or 0.0)) for i, u, t in session.execute(stmt)]

    def newest_row(self) -> int:
        with Session(self.engine) as session:
            return int(session.scalar(select(func.coalesce(func.max(self.row.id), 0))) or 0)

    def finished_at(self, ids: Sequence[str]) -> dict[str, float]:
        out: dict[str, float] = {}
        with Session(self.engine) as session:
            for i in range(0, len(ids), IN_CHUNK):
                chunk = list(ids[i:i + IN_CHUNK])
                out.update(session.execute(select(self.row.uid, self.made_at).where(self.row.uid.in_(chunk))).all())
        return out

    def oldest_finished_at(self, origin: str) -> float | None:
        with Session(self.engine) as session:
            return session.scalar(select(func.min(self.made_at)).where(self.row.node_id == origin))


def pack_json(records: Iterable[Any], ids: Sequence[str], max_bytes: int,
              uid_of: Callable[[Any], str], to_json: Callable[[Any], str]) -> tuple[list[str], list[str], list[str]]:
    """(records as JSON texts within max_bytes (the first always), deferred ids, missing ids)."""
    parts: list[str] = []
    size = 0
    sent: set[str] = set()
    deferred: list[str] = []
    for record in records:
        part = to_json(record)
        if parts and size + len(part) > max_bytes:
            deferred.append(uid_of(record))
            continue
        parts.append(part)
        size += len(part) + 1
        sent.add(uid_of(record))
    later = set(deferred)
    return parts, deferred, [u for u in ids if u not in sent and u not in later]
