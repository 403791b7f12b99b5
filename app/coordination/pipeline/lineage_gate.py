"""A node running several configs: which lineage plays its self-play turn and which claims
the next training generation, by the shares of the scheduler across configs.

One lineage per config runs the whole one-lineage pipeline (app/config/configs.py says how
they are kept apart); this gate is the only thing they share. It keeps the recorded history
the scheduler reads (the core-seconds each config had on this node, the CPU-hours at which
each decided generation was learned, when each config last decided one; persisted in
`config_scheduler.json`), recomputes the allocation (config_scheduler.allocate, pure) every
`scheduler.interval_s` and at once on a promotion, and says why in /status, the metrics and
an ALLOCATION_CHANGED event. Self-play: one lineage's batch at a time, the turn going to the
config furthest below its share of the core-seconds played. Training: one generation at a
time on the node, claimed by the config furthest below its share of the training seconds
among those not just told there is nothing to claim.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.atomic_files import atomic_write_json
from app.config.configs import SchedulerConfig
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.pipeline.config_scheduler import (
    Allocation, ConfigHistory, allocate, evaluations, moved, pick_next,
)
from app.coordination.pipeline.state import Stage
from app.log import get_logger

log = get_logger(__name__)
STATE_FILE = "config_scheduler.json"
NOTHING_TO_CLAIM_S = 15.0  # a config the leader had no generation for steps aside this long
HOUR = 3600.0
TURN_HOLD_S = 3.0  # a lineage between two self-play batches keeps its place this long
HISTORY_KEPT = 256  # decided generations remembered per config


@dataclass
class GatedLineage:
    """What the gate reads of one lineage: its name and weight, its pipeline (stage, claim) and
    its decided generations as /progress lists them (may do I/O: called off the loop)."""

    name: str
    weight: float
    pipe: Any  # PipelineContext
    generations: Callable[[], list[dict[str, Any]]]


class LineageGate:
    def __init__(self, lineages: list[GatedLineage], cfg: SchedulerConfig, data_dir: Path, node_id: str,
                 router: EventRouter | None = None, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.lineages = {ln.name: ln for ln in lineages}
        self.cfg = cfg
        self.node_id = node_id
        self.router = router
        self.clock = clock
        self.file = data_dir / STATE_FILE
        saved = _load(self.file)
        names = list(self.lineages)
        self.cpu_s: dict[str, float] = {n: float(saved.get("cpu_s", {}).get(n, 0.0)) for n in names}
        self.train_s: dict[str, float] = {n: float(saved.get("train_s", {}).get(n, 0.0)) for n in names}
        self.cpu_hours_at: dict[str, dict[int, float]] = {
            n: {int(g): float(h) for g, h in saved.get("cpu_hours_at", {}).get(n, {}).items()} for n in names}
        now = clock()
        self.last_decided: dict[str, float] = {n: float(saved.get("last_decided", {}).get(n, now)) for n in names}
        self.allocation = Allocation({n: 1.0 / len(names) for n in names}, {n: "equal shares until the first computation"
                                                                              for n in names})
        self.trigger = "start"
        self.computed_at: float | None = None
        self.changes: dict[str, int] = {}
        self._turn_holder: str | None = None
        self._turn_wanting: set[str] = set()
        self._released: dict[str, float] = {}
        self._turn_changed = asyncio.Condition()
        self._nothing_until: dict[str, float] = {}
        self._wake = asyncio.Event()
        self._pending_trigger = "start"
        self._metrics(registry)

    def _metrics(self, registry: CollectorRegistry | None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        labels = ["node", "config"]
        self.m_share = Gauge("mesh_config_share", "The scheduler's share of compute for a config (sums to 1).", labels, registry=r)
        self.m_progress = Gauge("mesh_config_progress_elo_per_cpu_hour",
                                "|Elo slope| per CPU-hour over the last K evaluations (Elo -> self-play).", labels, registry=r)
        self.m_regressing = Gauge("mesh_config_regressing", "1 while a config's Elo is below its peak by more than "
                                  "the margin (regression -> curriculum boost).", labels, registry=r)
        self.m_cpu = Gauge("mesh_config_cpu_seconds", "Core-seconds this node gave a config.", labels, registry=r)
        self.m_changes = Counter("mesh_config_allocation_changes", "Allocations published, by trigger "
                                 "(progress, regression, promotion, start).", ["node", "trigger"], registry=r)
        for name in self.lineages:
            self.m_share.labels(self.node_id, name).set(self.allocation.shares[name])

    # -- the recorded history and the pure decision ------------------------------------
    def on_promoted(self, name: str) -> None:
        """A lineage promoted (decided here or learned by gossip): recompute at once."""
        if self.cfg.rebalance_on_promotion:
            self._pending_trigger = "promotion"
            self._wake.set()

    async def run(self) -> None:
        while True:
            try:
                await self.recompute(self._pending_trigger)
            except Exception:  # noqa: BLE001 - a bad history read must not stop the node's scheduling
                log.exception("config_allocation_failed")
            self._pending_trigger = "progress"
            try:
                await asyncio.wait_for(self._wake.wait(), self.cfg.interval_s)
            except TimeoutError:
                pass
            self._wake.clear()

    async def recompute(self, trigger: str) -> Allocation:
        generations = {n: await asyncio.to_thread(ln.generations) for n, ln in self.lineages.items()}
        return await self.decide(generations, trigger)

    async def decide(self, generations: Mapping[str, list[dict[str, Any]]], trigger: str) -> Allocation:
        """Record what is new in `generations`, allocate, publish what changed."""
        now = self.clock()
        for name, gens in generations.items():
            seen = self.cpu_hours_at[name]
            for g in gens:
                generation = int(g.get("generation", 0))
                if generation > 0 and generation not in seen:
                    seen[generation] = self.cpu_s[name] / HOUR
                    self.last_decided[name] = now
            for old_generation in sorted(seen)[:-HISTORY_KEPT]:  # bounded: the scheduler reads the last K
                del seen[old_generation]
        histories = [ConfigHistory(name, ln.weight, evaluations(generations.get(name, []), self.cpu_hours_at[name]),
                                   max(0.0, (now - self.last_decided[name]) / HOUR))
                     for name, ln in self.lineages.items()]
        old = self.allocation
        new = allocate(histories, self.cfg)
        newly_regressing = sorted(set(new.regressing) - set(old.regressing))
        if newly_regressing:
            trigger = "regression"
        publish = trigger in ("promotion", "regression", "start") or moved(old.shares, new.shares, self.cfg.min_change)
        self.allocation, self.computed_at = new, now
        self._save()
        for name in self.lineages:
            self.m_share.labels(self.node_id, name).set(new.shares[name])
            self.m_progress.labels(self.node_id, name).set(new.progress.get(name) or 0.0)
            self.m_regressing.labels(self.node_id, name).set(1.0 if name in new.regressing else 0.0)
            self.m_cpu.labels(self.node_id, name).set(self.cpu_s[name])
        if publish:
            self.trigger = trigger
            self.changes[trigger] = self.changes.get(trigger, 0) + 1
            self.m_changes.labels(self.node_id, trigger).inc()
            log.info("config_allocation", trigger=trigger, shares=new.to_json()["shares"], regressing=list(new.regressing))
            if self.router is not None:
                await self.router.publish(EventType.ALLOCATION_CHANGED, {
                    "trigger": trigger, "shares": new.shares, "reasons": {k: v[:300] for k, v in new.reasons.items()},
                    "regressing": list(new.regressing)})
        async with self._turn_changed:
            self._turn_changed.notify_all()
        return new

    def status(self) -> dict[str, Any]:
        """/status (the node's inventory `config_allocation`), /progress and the dashboard."""
        return {**self.allocation.to_json(), "trigger": self.trigger, "changes": dict(self.changes),
                "computed_at": self.computed_at,
                "cpu_hours": {n: round(s / HOUR, 4) for n, s in self.cpu_s.items()},
                "training_hours": {n: round(s / HOUR, 4) for n, s in self.train_s.items()},
                "selfplay_turn": self._turn_holder}

    def _save(self) -> None:
        atomic_write_json(self.file, {"cpu_s": self.cpu_s, "train_s": self.train_s,
                                      "cpu_hours_at": {n: {str(g): h for g, h in m.items()} for n, m in self.cpu_hours_at.items()},
                                      "last_decided": self.last_decided})

    # -- self-play turns ------------------------------------------------------------------
    @asynccontextmanager
    async def selfplay_turn(self, name: str) -> AsyncIterator[Callable[[int], None]]:
        """Wait for `name`'s turn; yields `played(workers)` to say how many cores the batch
        used (counted as core-seconds when the turn ends)."""
        workers = [1]
        async with self._turn_changed:
            self._turn_wanting.add(name)
            try:
                while not self._my_turn(name):
                    try:  # woken by a release or a new allocation; a lapsed hold is seen within TURN_HOLD_S
                        await asyncio.wait_for(self._turn_changed.wait(), TURN_HOLD_S)
                    except TimeoutError:
                        pass
            finally:
                self._turn_wanting.discard(name)
            self._turn_holder = name
        started = time.monotonic()
        try:
            yield lambda n: workers.__setitem__(0, max(1, int(n)))
        finally:
            self.cpu_s[name] += (time.monotonic() - started) * workers[0]
            async with self._turn_changed:
                self._turn_holder = None
                self._released[name] = time.monotonic()
                self._turn_changed.notify_all()

    def _my_turn(self, name: str) -> bool:
        """Free, and `name` is the furthest below its share of those wanting a turn or just done
        with one (a lineage between two batches keeps its place for TURN_HOLD_S: else the other
        one, always waiting when a batch ends, would take every other turn whatever the shares)."""
        if self._turn_holder is not None:
            return False
        now = time.monotonic()
        between = {n for n, t in self._released.items() if now - t < TURN_HOLD_S}
        return pick_next(self.allocation.shares, self.cpu_s, sorted(self._turn_wanting | between)) == name

    def evaluating(self) -> bool:
        """Some config's gauntlet runs on this node (every lineage's self-play leaves it the cores)."""
        return any(ln.pipe.state.stage is Stage.TRAINED for ln in self.lineages.values())

    # -- training claims ------------------------------------------------------------------
    def busy(self, name: str) -> bool:
        pipe = self.lineages[name].pipe
        cluster = pipe.cluster
        return pipe.state.stage is not Stage.COLLECTING or (cluster is not None and cluster.current is not None)

    def may_claim(self, name: str) -> bool:
        """One generation at a time on this node, and the next for the config furthest below
        its share of the training time (of those the leader did not just have nothing for)."""
        if any(self.busy(other) for other in self.lineages if other != name):
            return False
        now = time.monotonic()
        candidates = [n for n in self.lineages if n == name or self._nothing_until.get(n, 0.0) <= now]
        return pick_next(self.allocation.shares, self.train_s, candidates) == name

    def claimed(self, name: str, got: bool) -> None:
        if not got:
            self._nothing_until[name] = time.monotonic() + NOTHING_TO_CLAIM_S

    async def account_training(self, interval_s: float = 1.0) -> None:
        """Every second a lineage is past COLLECTING on this node (training, evaluating,
        deciding) counts as one core-second for it, and as training time."""
        while True:
            await asyncio.sleep(interval_s)
            for name in self.lineages:
                if self.busy(name):
                    self.cpu_s[name] += interval_s
                    self.train_s[name] += interval_s


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("config_scheduler_state_unreadable", path=str(path), error=str(exc))
        return {}
    return data if isinstance(data, dict) else {}

