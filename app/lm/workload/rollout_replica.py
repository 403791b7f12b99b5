"""The rollout store as the pipeline sees it (steps.ItemStore: RolloutItems), and its groups
as a ReplicatedStore, so replication carries rollouts as it carries games: served as
/replica/rollouts/ (replica_server.replica_routes) and pulled by a
`Replicator(..., store_name="rollouts")`.

Like GameStore, its range digests come from a RowIndex (row_index.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from app.coordination.pipeline.steps import CreatedCounts
from app.coordination.sync.replica_store import ReplicatedStore
from app.coordination.sync.row_index import RowIndex, pack_json
from app.db.rollout_store import RolloutGroupRecord, RolloutGroupRow, RolloutStore

STORE_NAME = "rollouts"  # the /replica/<name>/ of this store


class RolloutReplicaStore:
    """Thread-safe: the replication daemon and the replica server call it from worker threads."""

    def __init__(self, store: RolloutStore | str | Path) -> None:
        self._own = not isinstance(store, RolloutStore)
        self.store = RolloutStore(store) if self._own else store
        self.index = RowIndex(self.store.engine, RolloutGroupRow, RolloutGroupRow.created_at)
        self.refresh, self.count, self.top_digests = self.index.refresh, self.index.count, self.index.top_digests
        self.digest, self.ids = self.index.digest, self.index.ids
        self.finished_at, self.oldest_finished_at = self.index.finished_at, self.index.oldest_finished_at
        self.since, self.newest_row = self.index.since, self.index.newest_row

    def close(self) -> None:
        if self._own:
            self.store.close()

    def fetch_json(self, ids: Sequence[str], max_bytes: int) -> tuple[list[str], list[str], list[str]]:
        return pack_json(self.store.iter_groups(uids=list(ids)), ids, max_bytes,
                         lambda r: r.uid, lambda r: r.model_dump_json())

    def insert(self, records: Sequence[dict[str, Any]]) -> int:
        """Every record is parsed before any is written: a malformed one (ValueError, naming
        the field) stores nothing of the batch."""
        parsed = [RolloutGroupRecord.model_validate(r) for r in records]
        return self.store.add_groups(parsed)


class RolloutItems:
    """Self-play's rollout groups (steps.ItemStore): one group is an item, a completion a sample."""

    def __init__(self, rollouts_db: Path, group_size: int) -> None:
        self.rollouts_db = rollouts_db
        self.group_size = group_size

    def newest_id(self) -> int:
        with RolloutStore(self.rollouts_db) as store:
            return store.max_id()

    def created_counts(self, node_id: str) -> CreatedCounts:
        with RolloutStore(self.rollouts_db) as store:
            groups = store.count(node_id)
            return {"games_created": groups, "positions_created": groups * self.group_size,
                    "games_max_id": store.max_id()}

    def replica(self) -> tuple[str, ReplicatedStore]:
        """A store of its own for the caller to close. Rollouts are replicated as Connect
        Four's games are: a claimant's export sees its peers' groups without a pull of its own."""
        return STORE_NAME, RolloutReplicaStore(self.rollouts_db)
