"""Records replicated as they are made: the origin pushes each new record to its holders at once.

Anti-entropy (replication.py) repairs whatever is missing, but it pulls once a round, so what a
node made since the last round died with it: with fast self-play, hundreds of games. So the
node that made a record sends it itself, the moment it is stored: `push_new` finds its records
stored since the last look (the store's row order), and POSTs them to `/replica/<store>/push`
of the nodes placement gives them (ranges.holders: `factor` nodes, the origin one of them; with
`prefetch`, every alive peer, since they would pull them anyway). Each peer has its own push
in flight, so a slow peer holds up no other. A record counts as replicated once `factor - 1`
peers have acknowledged holding it (their signed answers name the ids); the time from its
making to then is its replication lag. A peer that does not answer is tried
again after a short backoff; the record stays pending (and anti-entropy may bring it there
first). Pending records are bounded: past `max_pending` the oldest are left to anti-entropy.

Only the records a node made are pushed, and a receiver takes a push only from the records'
origin (replica_server.py): copies of other nodes' records move by pulls.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from app.coordination.p2p.client import MeshClient
from app.coordination.sync.ranges import FINE_DEPTH, holders, range_of
from app.coordination.sync.replica_store import ReplicatedStore
from app.coordination.sync.wire import MAX_FETCH_UIDS, ReplicaPushAnswer
from app.log import get_logger

log = get_logger(__name__)
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


@dataclass
class _Pending:
    made_at: float  # wall time the record was made
    fine: str  # its fine range (placement)
    acked: set[str] = field(default_factory=set)  # peers that hold it
    counted: bool = False  # its lag is recorded


@dataclass
class PushStatus:
    """What /status shows of pushing: lags of the latest replicated records, what is pending."""

    pushed_total: int = 0
    pending: int = 0
    oldest_pending_s: float | None = None
    lag_p50_s: float | None = None
    lag_p99_s: float | None = None
    lag_max_s: float | None = None
    samples: int = 0
    dropped_total: int = 0  # left to anti-entropy (too many pending)

    def to_json(self) -> dict[str, Any]:
        r = lambda v: None if v is None else round(v, 3)  # noqa: E731
        return {"pushed_total": self.pushed_total, "pending": self.pending, "oldest_pending_s": r(self.oldest_pending_s),
                "lag_s": {"p50": r(self.lag_p50_s), "p99": r(self.lag_p99_s), "max": r(self.lag_max_s),
                          "samples": self.samples},
                "dropped_total": self.dropped_total}


def _quantile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


class Pusher:
    def __init__(self, node_id: str, client: MeshClient, store: ReplicatedStore, *, factor: int,
                 store_name: str = "games", prefetch: bool = True, max_bytes: int = 512 * 1024,
                 timeout: float = 5.0, max_pending: int = 50_000, lag_window: int = 4096,
                 max_per_round: int = 1024, settle_s: float = 30.0) -> None:
        """`max_per_round`: records pushed to one peer per call; `settle_s`: how long a record
        already on `factor` nodes is still pushed to the other targets (prefetch) before
        anti-entropy is left to bring it there."""
        self.node_id, self.client, self.store = node_id, client, store
        self.factor, self.store_name, self.prefetch = max(1, factor), store_name, prefetch
        self.max_bytes, self.timeout, self.max_pending = max_bytes, timeout, max_pending
        self.max_per_round, self.settle_s = max_per_round, settle_s
        self.after: int | None = None  # row id up to which own records are known (None: not started)
        self.pending: OrderedDict[str, _Pending] = OrderedDict()
        self.lags: deque[float] = deque(maxlen=lag_window)
        self.pushed_total = 0
        self.dropped_total = 0
        self._backoff: dict[str, tuple[float, float]] = {}  # peer -> (retry at, delay)
        self._inflight: dict[str, asyncio.Future[int]] = {}  # peer -> its push in flight
        self.on_replicated: Any = None  # callback(lag_s) per record that reached `factor` nodes

    async def push_new(self, peers: dict[str, str], members: list[str], wait: bool = True) -> int:
        """Take in the records made since the last call and push every pending one to the peers
        that should hold it and have not said so. Each peer has at most one push in flight, so
        a slow peer never holds up the others (a record needs only `factor - 1` of them).
        `wait`: until the pushes started now are answered; how many acknowledgements they
        brought (without `wait`, 0: the loop calls again soon and they land as they come).
        `peers`: alive peer id -> address; `members`: alive node ids, this one included."""
        await self._take_new()
        if not self.pending:
            return 0
        now = time.monotonic()
        ready = [peer for peer in peers if self._backoff.get(peer, (0.0, 0.0))[0] <= now
                 and (peer not in self._inflight or self._inflight[peer].done())]
        by_peer: dict[str, list[str]] = {}
        for uid, p in self.pending.items():
            for peer in self._targets(p.fine, members, peers):
                if peer in ready and peer not in p.acked:
                    batch = by_peer.setdefault(peer, [])
                    if len(batch) < self.max_per_round:
                        batch.append(uid)
        started = []
        for peer, uids in by_peer.items():
            task = asyncio.ensure_future(self._push_to(peer, peers[peer], uids))
            self._inflight[peer] = task
            started.append(task)
        acknowledged = sum(await asyncio.gather(*started)) if wait and started else 0
        self._forget(members, peers)
        return acknowledged

    async def close(self) -> None:
        """Cancel the pushes in flight (the daemon stops)."""
        for task in self._inflight.values():
            task.cancel()
        await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        self._inflight.clear()

    async def _take_new(self) -> None:
        if self.after is None:  # records made before this process started are anti-entropy's
            self.after = await asyncio.to_thread(self.store.newest_row)
            return
        while True:
            rows = await asyncio.to_thread(self.store.since, self.node_id, self.after, 1000)
            for row_id, uid, made_at in rows:
                self.pending[uid] = _Pending(made_at, range_of(uid, FINE_DEPTH))
                self.after = row_id
            if len(rows) < 1000:
                break
        while len(self.pending) > self.max_pending:
            self.pending.popitem(last=False)
            self.dropped_total += 1

    def _targets(self, fine: str, members: list[str], peers: dict[str, str]) -> list[str]:
        if self.prefetch:
            return list(peers)
        return [h for h in holders(self.node_id, fine, members, self.factor) if h in peers]

    async def _push_to(self, peer: str, addr: str, uids: list[str]) -> int:
        """Push `uids` to one peer in bodies of at most `max_bytes`; the ids it acknowledged."""
        acknowledged = 0
        try:
            while uids:
                batch = uids[:MAX_FETCH_UIDS]
                parts, deferred, missing = await asyncio.to_thread(self.store.fetch_json, batch, self.max_bytes)
                for uid in missing:  # gone from our own store (replaced DB): nothing to push
                    self.pending.pop(uid, None)
                sent = set(batch) - set(deferred) - set(missing)
                uids = deferred + uids[len(batch):]
                if not parts:
                    continue
                answer = await self._post(addr, '{"records": [' + ",".join(parts) + "]}")
                for uid in set(answer.held) & sent:
                    p = self.pending.get(uid)
                    if p is not None and peer not in p.acked:
                        p.acked.add(peer)
                        acknowledged += 1
                        self._count(p)
            self._backoff.pop(peer, None)
        except _TRANSPORT_ERRORS as exc:
            delay = min(5.0, 2 * self._backoff.get(peer, (0.0, 0.125))[1])
            self._backoff[peer] = (time.monotonic() + delay, delay)
            log.warning("replication_push_failed", peer=peer, error=repr(exc)[:300], retry_in_s=delay)
        return acknowledged

    async def _post(self, addr: str, body: str) -> ReplicaPushAnswer:
        status, data = await self.client.request("POST", addr, f"/replica/{self.store_name}/push",
                                                 body.encode(), timeout=self.timeout)
        if status != 200 or not isinstance(data, dict):
            why = data.get("error") if isinstance(data, dict) else str(data)[:200]
            raise ValueError(f"push answered HTTP {status}: {why}")
        return ReplicaPushAnswer.model_validate(data)

    def _count(self, p: _Pending) -> None:
        """A peer acknowledged `p`: once `factor - 1` have, its lag is recorded (the daemon caps
        the factor at the cluster's size, dead nodes counted, so it never counts as replicated
        while too few nodes are up)."""
        if not p.counted and len(p.acked) >= self.factor - 1:
            p.counted = True
            lag = max(0.0, time.time() - p.made_at)
            self.lags.append(lag)
            self.pushed_total += 1
            if self.on_replicated is not None:
                self.on_replicated(lag)

    def _forget(self, members: list[str], peers: dict[str, str]) -> None:
        """Forget the records on `factor` nodes that every target holds (or that anti-entropy is
        left to bring there after `settle_s`)."""
        now = time.time()
        done = []
        for uid, p in self.pending.items():
            self._count(p)  # the factor may have dropped (a node left for good)
            if p.counted and (now - p.made_at > self.settle_s
                              or all(t in p.acked for t in self._targets(p.fine, members, peers))):
                done.append(uid)
        for uid in done:
            del self.pending[uid]

    def status(self) -> PushStatus:
        lags = sorted(self.lags)
        waiting = [p.made_at for p in self.pending.values() if not p.counted]
        return PushStatus(
            pushed_total=self.pushed_total, pending=len(waiting),
            oldest_pending_s=max(0.0, time.time() - min(waiting)) if waiting else None,
            lag_p50_s=_quantile(lags, 0.5), lag_p99_s=_quantile(lags, 0.99), lag_max_s=lags[-1] if lags else None,
            samples=len(lags), dropped_total=self.dropped_total)
