"""Anti-entropy replication: each round, pull from the alive peers what this node lacks, and
count which of its own records fewer than the replication factor's nodes hold.

How a round finds the difference with one peer without exchanging id lists: both sides digest
every origin's ids (count, XOR of hashes); equal digests mean nothing to do. A differing digest
is split into the 16 child ranges (ranges.py) and only differing children are followed, down
to ranges small enough to list. Results are cached per (peer, origin, range) against the pair
of digests they came from, so a range that differs for good (a peer that is not meant to hold
it) costs one comparison per round, not a listing.

What is pulled: the ranges this node should hold (ranges.holders: the origin plus the next
nodes in rendezvous order, `factor` in all) come first; with `prefetch` the rest follows, so a
node that may claim a generation already has most games when it exports. Pulls go through the
store's idempotent insert (a game already here is skipped by uid), in bounded batches, at most
`max_bytes_per_s` on average and `max_records_per_round` per round.

The same class replicates any ReplicatedStore served under /replica/<store>/ (replica_server.py).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from pydantic import BaseModel, ValidationError

from app.coordination.p2p.client import MeshClient
from app.coordination.sync.ranges import (
    EMPTY,
    FINE_DEPTH,
    MAX_DEPTH,
    Digest,
    children,
    range_of,
    responsible,
    under_replicated,
)
from app.coordination.sync.replica_server import parse_digest
from app.coordination.sync.replica_store import ReplicatedStore
from app.coordination.sync.wire import (
    MAX_FETCH_UIDS,
    RangeDigests,
    RangeIds,
    ReplicaFetchAnswer,
    TopDigests,
)
from app.log import get_logger

log = get_logger(__name__)
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)
_PAGE = 1000
_MAX_CACHE = 50_000


class PeerError(RuntimeError):
    """One peer failed this round (unreachable, refused, malformed); names the peer."""


@dataclass(frozen=True)
class ReplicationStatus:
    """What a node gossips about its copies (and /status shows): how many records it holds,
    how many of its own fewer than `factor` nodes hold, the oldest such one's age, and how many
    of its own each alive peer holds."""

    factor: int
    held: int = 0
    own: int = 0
    under_replicated: int = 0
    oldest_under_replicated_s: float | None = None
    own_held_by: dict[str, int] = field(default_factory=dict)
    pulled_total: int = 0
    bytes_in_total: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "factor": self.factor, "held": self.held, "own": self.own,
            "under_replicated": self.under_replicated,
            "oldest_under_replicated_s": (None if self.oldest_under_replicated_s is None
                                          else round(self.oldest_under_replicated_s, 1)),
            "own_held_by": dict(sorted(self.own_held_by.items())),
            "pulled_total": self.pulled_total, "bytes_in_total": self.bytes_in_total,
        }


@dataclass
class RoundReport:
    pulled: int = 0
    bytes_in: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    status: ReplicationStatus | None = None


class PeerLink:
    """The /replica/<store>/ endpoints of one peer, with the bytes they moved counted."""

    def __init__(self, client: MeshClient, peer: str, addr: str, store_name: str, timeout: float) -> None:
        self.client, self.peer, self.addr, self.timeout = client, peer, addr, timeout
        self.base = f"/replica/{store_name}"
        self.bytes_in = 0

    async def call(self, method: str, path: str, body: Any, model: type[BaseModel]) -> Any:
        try:
            status, data = await self.client.request(method, self.addr, self.base + path, body, timeout=self.timeout)
        except _TRANSPORT_ERRORS as exc:
            raise PeerError(f"{self.peer}: {method} {self.base}{path} failed: {exc!r}") from None
        self.bytes_in += len(json.dumps(data)) if data is not None else 0
        if status != 200:
            why = data.get("error") if isinstance(data, dict) else str(data)[:200]
            raise PeerError(f"{self.peer}: {method} {self.base}{path} answered HTTP {status}: {why}")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise PeerError(f"{self.peer}: malformed answer to {self.base}{path}: {exc.errors()[:2]}") from None

    async def top(self) -> dict[str, Digest]:
        answer: TopDigests = await self.call("GET", "/digest", None, TopDigests)
        return {o: parse_digest(d) for o, d in answer.origins.items()}

    async def children(self, origin: str, prefix: str) -> list[Digest]:
        answer: RangeDigests = await self.call("POST", "/digest", {"origin": origin, "prefix": prefix}, RangeDigests)
        return [parse_digest(d) for d in answer.children]

    async def ids(self, origin: str, prefix: str) -> set[str]:
        found: set[str] = set()
        after = ""
        while True:
            page: RangeIds = await self.call("POST", "/ids", {"origin": origin, "prefix": prefix, "after": after,
                                                              "limit": _PAGE}, RangeIds)
            if page.ids and page.ids[0] <= after:
                raise PeerError(f"{self.peer}: ids of range {prefix!r} not ascending after {after!r}")
            found.update(page.ids)
            if len(page.ids) < _PAGE:
                return found
            after = page.ids[-1]

    async def fetch(self, ids: list[str]) -> ReplicaFetchAnswer:
        return await self.call("POST", "/fetch", {"ids": ids}, ReplicaFetchAnswer)


class Replicator:
    """One node's anti-entropy for one store. `run_round` is called periodically by the
    replication daemon (app/coordination/pipeline/replication_daemon.py)."""

    def __init__(self, node_id: str, client: MeshClient, store: ReplicatedStore, *, factor: int,
                 store_name: str = "games", prefetch: bool = True, batch: int = 128,
                 max_bytes_per_s: float = 8e6, max_records_per_round: int = 2000,
                 list_max: int = 128, timeout: float = 10.0) -> None:
        if not 1 <= batch <= MAX_FETCH_UIDS:
            raise ValueError(f"batch must be in 1..{MAX_FETCH_UIDS}")
        self.node_id, self.client, self.store, self.factor = node_id, client, store, max(1, factor)
        self.store_name, self.prefetch, self.batch = store_name, prefetch, batch
        self.max_bytes_per_s, self.max_records_per_round = max_bytes_per_s, max_records_per_round
        self.list_max, self.timeout = list_max, timeout
        self.pulled_total = 0
        self.bytes_in_total = 0
        self._cache: dict[tuple[str, str, str, bool, bool], tuple[tuple[Digest, Digest], tuple[set[str], set[str]]]] = {}
        self._epoch: tuple[tuple[str, ...], int] = ((), 0)

    async def run_round(self, peers: dict[str, str], members: list[str]) -> RoundReport:
        """`peers`: alive peer id -> address; `members`: the alive node ids, this one included."""
        report = RoundReport()
        started = time.monotonic()
        epoch = (tuple(sorted(members)), self.factor)
        if epoch != self._epoch:  # placement changed: cached walks say what the old one wanted
            self._cache.clear()
            self._epoch = epoch
        local_top = await asyncio.to_thread(self.store.top_digests)
        wanted: dict[str, tuple[int, str]] = {}  # id -> (tier: 0 held by placement, 1 prefetch; peer)
        lacking: dict[str, set[str] | None] = {}
        links = {p: PeerLink(self.client, p, addr, self.store_name, self.timeout) for p, addr in peers.items()}
        for peer, link in links.items():
            lacking[peer] = None
            try:
                theirs = await link.top()
                for origin in sorted(set(theirs) | {self.node_id}):
                    their_d, my_d = theirs.get(origin, EMPTY), local_top.get(origin, EMPTY)
                    mine_is_origin = origin == self.node_id
                    placed = responsible(self.node_id, origin, "", members, self.factor)
                    pull = their_d[0] > 0 and (self.prefetch or placed)
                    account = mine_is_origin and their_d[0] > 0
                    if their_d == my_d:
                        if mine_is_origin:
                            lacking[peer] = set()
                        continue
                    if not (pull or account):
                        continue
                    get, lack = await self._diff(link, origin, "", their_d, my_d, pull, account, members)
                    if account:
                        lacking[peer] = lack
                    for uid in get:
                        fine = range_of(uid, FINE_DEPTH)
                        tier = 0 if responsible(self.node_id, origin, fine, members, self.factor) else 1
                        if tier and not self.prefetch:
                            continue  # listed with a range this node only partly holds
                        if uid not in wanted or tier < wanted[uid][0]:
                            wanted[uid] = (tier, peer)
            except PeerError as exc:
                report.errors[peer] = str(exc)
                log.warning("replication_peer_failed", peer=peer, error=str(exc))
        for link in links.values():
            report.bytes_in += link.bytes_in
        await self._pull(links, wanted, report, started)
        self.pulled_total += report.pulled
        self.bytes_in_total += report.bytes_in
        report.status = await self._status(local_top, lacking, members)
        if len(self._cache) > _MAX_CACHE:
            self._cache.clear()
        return report

    async def _diff(self, link: PeerLink, origin: str, prefix: str, their_d: Digest, my_d: Digest,
                    pull: bool, account: bool, members: list[str]) -> tuple[set[str], set[str]]:
        """(ids the peer has and this node lacks, ids this node has and the peer lacks) in range
        `prefix` of `origin`; the first only when `pull`, the second only when `account`."""
        if their_d == my_d:
            return set(), set()
        key = (link.peer, origin, prefix, pull, account)
        hit = self._cache.get(key)
        if hit is not None and hit[0] == (their_d, my_d):
            return hit[1]
        if their_d[0] + my_d[0] <= self.list_max or len(prefix) >= MAX_DEPTH or their_d[0] == 0 or my_d[0] == 0:
            theirs = await link.ids(origin, prefix) if their_d[0] > 0 and (pull or account) else set()
            mine = set(await asyncio.to_thread(self.store.ids, origin, prefix, "", 10**9)) if my_d[0] else set()
            result = (theirs - mine if pull else set(), mine - theirs if account else set())
        else:
            remote = await link.children(origin, prefix)
            local = await asyncio.to_thread(lambda: [self.store.digest(origin, c) for c in children(prefix)])
            get: set[str] = set()
            lack: set[str] = set()
            for child, r, m in zip(children(prefix), remote, local):
                sub_pull = pull and r[0] > 0 and (
                    self.prefetch or responsible(self.node_id, origin, child, members, self.factor))
                if r == m or not (sub_pull or account):
                    continue
                g, lk = await self._diff(link, origin, child, r, m, sub_pull, account, members)
                get |= g
                lack |= lk
            result = (get, lack)
        self._cache[key] = ((their_d, my_d), result)
        return result

    async def _pull(self, links: dict[str, PeerLink], wanted: dict[str, tuple[int, str]],
                    report: RoundReport, started: float) -> None:
        order = sorted(wanted, key=lambda u: wanted[u][0])[: self.max_records_per_round]
        by_peer: dict[str, list[str]] = {}
        for uid in order:
            by_peer.setdefault(wanted[uid][1], []).append(uid)
        for peer, uids in by_peer.items():
            link = links[peer]
            try:
                for i in range(0, len(uids), self.batch):
                    await self._fetch_batch(link, uids[i:i + self.batch], report)
                    # bounded bandwidth: never ahead of max_bytes_per_s since the round began
                    ahead = report.bytes_in / self.max_bytes_per_s - (time.monotonic() - started)
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            except PeerError as exc:
                report.errors[peer] = str(exc)
                log.warning("replication_pull_failed", peer=peer, error=str(exc))

    async def _fetch_batch(self, link: PeerLink, uids: list[str], report: RoundReport) -> None:
        wanted = list(uids)
        while wanted:
            before = link.bytes_in
            answer = await link.fetch(wanted)
            report.bytes_in += link.bytes_in - before
            asked = set(wanted)
            got = [r for r in answer.records if isinstance(r, dict)]
            strays = [r.get("uid") for r in got if r.get("uid") not in asked]
            if strays or len(got) != len(answer.records):
                raise PeerError(f"{link.peer}: sent records it was not asked for: {strays[:3]}")
            try:
                added = await asyncio.to_thread(self.store.insert, got)
            except ValueError as exc:
                raise PeerError(f"{link.peer}: {exc}") from None
            report.pulled += added
            done = {r["uid"] for r in got} | set(answer.missing)
            rest = [u for u in wanted if u not in done]
            if len(rest) == len(wanted):
                raise PeerError(f"{link.peer}: fetch of {len(wanted)} records made no progress")
            wanted = rest

    async def _status(self, local_top: dict[str, Digest], lacking: dict[str, set[str] | None],
                      members: list[str]) -> ReplicationStatus:
        own = local_top.get(self.node_id, EMPTY)[0]
        held = sum(d[0] for d in local_top.values())
        alive_lacking = {p: s for p, s in lacking.items() if p in members}
        under = under_replicated(alive_lacking, self.factor) if own else set()
        oldest: float | None = None
        if under is None:
            count = own
            first = await asyncio.to_thread(self.store.oldest_finished_at, self.node_id)
            oldest = None if first is None else time.time() - first
        else:
            count = len(under)
            if under:
                made = await asyncio.to_thread(self.store.finished_at, sorted(under))
                oldest = time.time() - min(made.values()) if made else None
        held_by = {p: (0 if s is None else own - len(s)) for p, s in lacking.items()}
        return ReplicationStatus(self.factor, held, own, count, oldest, held_by,
                                 self.pulled_total, self.bytes_in_total)


__all__ = ["PeerError", "PeerLink", "ReplicationStatus", "Replicator", "RoundReport"]
