"""Why messages are refused, in both directions: counted in /metrics, kept per peer for /status,
and logged at a bounded rate.

A node whose clock is 400 s off is refused by everyone; without this, no node says why. A flood
of bad requests must not become a flood of log lines either: each reason logs at most one line
per `log_interval`, carrying how many were left out since the last one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter

from app.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Refusal:
    code: str  # short reason, the metrics label
    reason: str  # the message, e.g. "timestamp outside the allowed window: clock 400 s ahead of ours"
    at: float  # wall time


class RateLimitedLog:
    """One warning per key per `interval`; the next one says how many were suppressed."""

    def __init__(self, interval: float = 10.0, max_keys: int = 256) -> None:
        self.interval = interval
        self.max_keys = max_keys
        self._last: OrderedDict[str, tuple[float, int]] = OrderedDict()

    def emit(self, key: str, event: str, **fields: object) -> bool:
        now = time.monotonic()
        last, suppressed = self._last.get(key, (float("-inf"), 0))
        if now - last < self.interval:
            self._last[key] = (last, suppressed + 1)
            return False
        self._last[key] = (now, 0)
        self._last.move_to_end(key)
        while len(self._last) > self.max_keys:
            self._last.popitem(last=False)
        log.warning(event, suppressed=suppressed, **fields)
        return True


class Refusals:
    """Counter `mesh_refusals_total{direction, reason}` in the node's registry, plus the last
    refusal per peer and direction (bounded: the oldest peers are forgotten first)."""

    def __init__(self, registry: CollectorRegistry | None = None, max_peers: int = 1024,
                 log_interval: float = 10.0) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.counter = Counter("mesh_refusals_total", "Mesh messages refused, by direction and reason.",
                               ["direction", "reason"], registry=self.registry)
        self.max_peers = max_peers
        self.log = RateLimitedLog(log_interval)
        self.last: dict[str, OrderedDict[str, Refusal]] = {"in": OrderedDict(), "out": OrderedDict()}
        self.counts: dict[str, dict[str, int]] = {"in": {}, "out": {}}  # direction -> reason -> count (/status)

    def _record(self, direction: str, peer: str, code: str, reason: str) -> None:
        self.counter.labels(direction, code).inc()
        counts = self.counts[direction]
        if code in counts or len(counts) < 256:  # codes are the code's own words: few
            counts[code] = counts.get(code, 0) + 1
        table = self.last[direction]
        table[peer] = Refusal(code, reason, time.time())
        table.move_to_end(peer)
        while len(table) > self.max_peers:
            table.popitem(last=False)
        what = "refused a request" if direction == "in" else "a peer refused our request"
        self.log.emit(f"{direction}:{code}", what, peer=peer, code=code, reason=reason)

    def refused_in(self, peer: str, code: str, reason: str) -> None:
        """We refused a request from `peer` (a node id, or an address when it proved none)."""
        self._record("in", peer, code, reason)

    def refused_out(self, peer: str, code: str, reason: str) -> None:
        """`peer` refused a request of ours."""
        self._record("out", peer, code, reason)

    def of_peer(self, *names: str) -> dict[str, dict[str, object] | None]:
        """The last refusal each way under any of `names` (id, address), for /status."""
        out: dict[str, dict[str, object] | None] = {}
        for direction, key in (("in", "we_refused"), ("out", "they_refused")):
            found = [self.last[direction][n] for n in names if n in self.last[direction]]
            latest = max(found, key=lambda r: r.at, default=None)
            out[key] = None if latest is None else {"code": latest.code, "reason": latest.reason,
                                                    "age_s": round(time.time() - latest.at, 1)}
        return out
