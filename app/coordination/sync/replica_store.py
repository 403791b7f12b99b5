"""What anti-entropy replication needs of a store, and the replay DB's games as one.

The interface is small on purpose so that another workload's records (the LM workload's
rollouts) replicate through the same server, client and daemon: ids grouped by origin node,
digests of id ranges, ids of one range, records by id, idempotent insertion, and the records
made since a row (what replica_push.py sends the moment they are stored).

GameStore serves the replay DB's games through a RowIndex (row_index.py: the range digests
of an insert-only table), as rollout_replica.py does for the LM workload's rollout groups.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from app.coordination.sync.ranges import Digest
from app.coordination.sync.row_index import RowIndex, pack_json
from app.db.replay_db import GameRecord, GameRow, ReplayDB


class ReplicatedStore(Protocol):
    """A node's insert-only collection of records, each with a unique id and an origin node."""

    def top_digests(self) -> dict[str, Digest]:
        """Digest of every origin's ids (the whole id space)."""
        ...

    def digest(self, origin: str, prefix: str) -> Digest:
        """Digest of origin's ids in the range `prefix` (ranges.py)."""
        ...

    def ids(self, origin: str, prefix: str, after: str, limit: int) -> list[str]:
        """Origin's ids in range `prefix` greater than `after`, ascending, at most `limit`."""
        ...

    def fetch_json(self, ids: Sequence[str], max_bytes: int) -> tuple[list[str], list[str], list[str]]:
        """(records as JSON texts within max_bytes (the first always), deferred ids, missing ids)."""
        ...

    def insert(self, records: Sequence[dict[str, Any]]) -> int:
        """Insert records received from a peer, skipping ids already held; how many were new.
        Raises ValueError on a malformed record (nothing of it is stored)."""
        ...

    def finished_at(self, ids: Sequence[str]) -> dict[str, float]:
        """When each record was made (for the age of under-replicated ones)."""
        ...

    def since(self, origin: str, after: int, limit: int) -> list[tuple[int, str, float]]:
        """(row id, id, made at) of origin's records stored after row `after`, oldest first."""
        ...

    def newest_row(self) -> int:
        """The newest row id (0 when empty): where pushing starts after a restart."""
        ...

    def oldest_finished_at(self, origin: str) -> float | None:
        """When origin's oldest record was made."""
        ...

    def count(self) -> int:
        ...


class GameStore:
    """The replay DB's games as a ReplicatedStore; thread-safe (the daemon and the server call
    it from worker threads)."""

    def __init__(self, db: ReplayDB | str | Path) -> None:
        self._own_db = not isinstance(db, ReplayDB)
        self.db = ReplayDB(db) if self._own_db else db
        self.index = RowIndex(self.db.engine, GameRow, GameRow.finished_at)
        self.refresh, self.count, self.top_digests = self.index.refresh, self.index.count, self.index.top_digests
        self.digest, self.ids = self.index.digest, self.index.ids
        self.finished_at, self.oldest_finished_at = self.index.finished_at, self.index.oldest_finished_at
        self.since, self.newest_row = self.index.since, self.index.newest_row

    def close(self) -> None:
        if self._own_db:
            self.db.close()

    def fetch_json(self, ids: Sequence[str], max_bytes: int) -> tuple[list[str], list[str], list[str]]:
        return pack_json(self.db.iter_games(uids=list(ids)), ids, max_bytes,
                         lambda r: r.uid, lambda r: json.dumps(r.to_json()))

    def insert(self, records: Sequence[dict[str, Any]]) -> int:
        from app.coordination.sync.game_sync import parse_game  # the checks game sync applies

        parsed: list[GameRecord] = [parse_game(r) for r in records]  # ValueError before any write
        return self.db.add_games(parsed)
