"""Groups rollout workers on other nodes made from this run's published policies (issue 53,
item 1), for the online trainer to take before it plays its own.

A worker fetches a policy directory the trainer published (policy_publish.py), generates
groups with it and stores them in its rollout store; replication brings them into this
node's `rollouts.db`, where the trainer reads them. What a group says about itself is not
trusted: its version is the one the trainer published the group's `model_sha256` as (a sha256
this run did not publish, or no longer keeps, is never taken), and its tokens must fit the
model's vocabulary. Each rank takes only the uids that hash to it, so two ranks never train
the same group; a group once handed over is not offered again (the rollout manager's
filters, staleness bound and consumed record decide the rest: rollout_manager.offer).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from app.db.rollout_records import RolloutGroupRecord
from app.db.rollout_store import RolloutStore
from app.lm.rollout.batches import to_group
from app.lm.samples import Group

MAX_READ = 256  # groups read from the store per step: a bound on what a flood of peers' groups costs


def rank_of(uid: str, world_size: int) -> int:
    """Which rank takes the group `uid`: a pure function, the same on every rank."""
    return int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % max(1, world_size)


def takeable(records: Sequence[RolloutGroupRecord], versions: Mapping[str, int], min_version: int,
             offered: Collection[str], vocab_size: int, rank: int = 0, world_size: int = 1) -> list[Group]:
    """The records this rank may take now, as groups stamped with the trainer's own version of
    the weights that made them (pure: the decision, no I/O)."""
    out = []
    for record in records:
        version = versions.get(record.model_sha256 or "")
        if version is None or version < min_version or record.uid in offered:
            continue
        if rank_of(record.uid, world_size) != rank:
            continue
        tokens = [*record.prompt_tokens, *(t for s in record.samples for t in s.response_tokens)]
        if len(record.samples) < 2 or any(t < 0 or t >= vocab_size for t in tokens):
            continue
        group = to_group(record)
        for s in group.samples:
            s.weight_version = version
        out.append(Group(prompt_id=group.prompt_id, samples=group.samples, weight_version=version, uid=record.uid))
    return out


class RemoteGroups:
    """Reads the node's rollout store for groups of this run's policies (`versions`: sha256 ->
    version, the publisher's) and remembers which it handed over."""

    def __init__(self, rollouts_db: str | Path, versions: Callable[[], Mapping[str, int]], vocab_size: int,
                 rank: int = 0, world_size: int = 1, exclude: Collection[str] = ()) -> None:
        """`exclude`: uids never to take (the run's consumed record: what it, or the run whose
        policies it inherited, trained already)."""
        self.rollouts_db, self.versions, self.vocab_size = rollouts_db, versions, vocab_size
        self.rank, self.world_size = rank, world_size
        self.offered: set[str] = set(exclude)
        self._read: dict[str, set[str]] = {}  # model sha256 -> uids read from the store in this run
        self.uids: set[str] = set()  # every uid taken from the store: the step's "remote_groups" count
        self._store: RolloutStore | None = None  # opened at the first read, kept for the run

    def take(self, min_version: int) -> list[Group]:
        """Groups of versions >= `min_version` not handed over before."""
        versions = {sha: v for sha, v in self.versions().items() if v >= min_version}
        if not versions:
            return []
        if self._store is None:
            self._store = RolloutStore(self.rollouts_db)
        records = self._store.groups_of_models(sorted(versions), exclude=self.offered, limit=MAX_READ)
        groups = takeable(records, versions, min_version, self.offered, self.vocab_size, self.rank, self.world_size)
        self.offered.update(r.uid for r in records)
        for r in records:
            self._read.setdefault(r.model_sha256 or "", set()).add(r.uid)
        self.uids.update(g.uid for g in groups)
        return groups

    def read_of(self, shas: Collection[str]) -> set[str]:
        """The uids this run read of the policies `shas`: what the next run of a trainer that
        stays, inheriting them, must not take again (trained here, or dropped here as stale)."""
        return set().union(*(self._read.get(sha, set()) for sha in shas))

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
