"""What the dashboard and the mesh gauges show, gathered from the mesh and the pipeline.

The health server (daemons layer) may not import the mesh or the pipeline, so the orchestrator
hands it two callables from here: `DashboardFeed.snapshot` (GET /dashboard.json) and
`DashboardFeed.mesh_gauges` (scraped as `mesh_term`, `mesh_voters_alive`, ...). Both run on the
event loop and only read memory: everything that touches a file (registry ratings, training
results, games in the replay DB) is read by `run()` in a worker thread every few seconds and
cached, so a page view or a scrape never waits on SQLite.

Per-generation training losses (and, on a lone node, Elo intervals) live where the candidate
was trained and evaluated, and each promoted model's accuracy on solver-scored positions where
it was scored (strength_watch.py); `generation_stats()` (generation_stats.py) reads them there and every node gossips
its own (`gen_stats` in its inventory), so any node's dashboard can chart every generation. In
a cluster the Elo of every generation is fitted from the gauntlet results the decided records
carry (generation_elo.py), the same on every node.

The same enriched generations answer GET /progress (`progress()`), so the CLI, the page and
the metrics (`mesh_model_elo{role="best"|"candidate"}`) agree.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.steps import ReportsStatus
from app.coordination.pipeline.feedback_apply import feedback_status
from app.coordination.pipeline.generation_elo import generation_anchors, rate_generations
from app.coordination.pipeline.generation_stats import STATS_FIELDS, generation_stats, registry_exists, stats_row
from app.db.registry import ModelRegistry, RegistryError
from app.log import get_logger
from app.games.train.gauntlet_baselines import anchor_player
from app.games.train.promotion import model_anchors

log = get_logger(__name__)

HISTORY_POINTS = 720  # a point per sample: an hour at the default 5 s
RATE_WINDOW_S = 60.0
Readiness = Callable[[], tuple[bool, str]]  # (ready, why not): the daemon manager's /readyz


# -- the feed ------------------------------------------------------------------------------
@dataclass
class _Cache:
    """What run() last read from disk."""

    local_generations: list[dict[str, Any]] = field(default_factory=list)  # single node: from the registry
    local_stats: dict[str, list] = field(default_factory=dict)
    local_games: int = 0
    local_positions: int = 0
    best_installed_at: float | None = None
    local_work: dict[str, int] | None = None  # the leader's own queue counts (a lone node leads itself)
    workload_panel: dict[str, Any] | None = None  # a workload's own panel (steps.ReportsStatus.dashboard)


class DashboardFeed:
    def __init__(self, pipe: PipelineContext, node: MeshNode, history: int = HISTORY_POINTS,
                 readiness: Readiness | None = None) -> None:
        self.pipe = pipe
        self.node = node
        self.readiness = readiness  # this node's; other nodes gossip theirs (`ready` in the inventory)
        self.cache = _Cache()
        self._record_elo: tuple[object, dict[int, list[float]]] = (None, {})  # (records it was fitted on, ratings)
        self._record_anchors: dict[int, str] = {}  # generation -> what its Elo is relative to
        self.series: deque[dict[str, float]] = deque(maxlen=history)  # cluster games/positions over time
        self.node_games: dict[str, deque[tuple[float, int]]] = {}  # per node (t, games created)

    # -- sampling (worker thread for disk, loop for the rest) -----------------------------
    async def run(self, interval_s: float = 5.0) -> None:
        """Until cancelled: refresh the disk cache and add a point to the time series."""
        while True:
            try:
                self.cache = await asyncio.to_thread(self._read_disk)
                self.sample(time.time())
            except Exception:  # noqa: BLE001 - the dashboard must never stop the node
                log.exception("dashboard_sample_failed")
            await asyncio.sleep(interval_s)

    def _read_disk(self) -> _Cache:
        paths = self.pipe.paths
        cache = _Cache(local_stats=generation_stats(paths))
        counts = self.pipe.steps.items.created_counts(self.pipe.node_id)
        cache.local_games = counts["games_created"]
        cache.local_positions = counts["positions_created"]
        if self.node.is_leader:  # its own queue, read here: it gossips it to others, not to itself
            cache.local_work = self.node.queue.summary()
        if isinstance(steps := self.pipe.steps, ReportsStatus):  # it reads its run's files
            cache.workload_panel = steps.dashboard(self.pipe, self._inventories())
        best = self.pipe.state.best_sha256
        if best is not None:
            try:
                cache.best_installed_at = os.stat(self.pipe.steps.models.installed_path(best)).st_mtime
            except OSError:
                cache.best_installed_at = None
        if self.pipe.cluster is None and registry_exists(paths.registry_db):
            try:
                with ModelRegistry(paths.registry_db, create=False) as registry:
                    anchors = model_anchors(registry, anchor_player(self.pipe.settings))
                    cache.local_generations = [
                        _registry_generation({**m.to_json(), "elo_anchor": anchors.get(m.sha256)}, self.pipe.node_id)
                        for m in registry.models() if m.generation > 0 and m.status.value != "candidate"]
            except RegistryError:
                pass
        return cache

    def sample(self, now: float) -> None:
        """One point of the games/positions series and of every node's games counter."""
        inv = self._inventories()
        games = sum(int(i.get("games_created", 0) or 0) for i in inv.values())
        positions = sum(int(i.get("positions_created", 0) or 0) for i in inv.values())
        self.series.append({"t": round(now, 1), "games": games, "positions": positions})
        for nid, i in inv.items():
            track = self.node_games.setdefault(nid, deque(maxlen=64))
            track.append((now, int(i.get("games_created", 0) or 0)))

    def _inventories(self) -> dict[str, dict[str, Any]]:
        """Every node's gossiped inventory; this node's own counts from the disk cache."""
        view = self.node.cluster_view()
        inv = {nid: dict(s.inventory) for nid, s in view.nodes.items()}
        mine = inv.setdefault(self.node.node_id, {})
        mine["games_created"] = self.cache.local_games
        mine["positions_created"] = self.cache.local_positions
        return inv

    def games_per_second(self, node_id: str) -> float | None:
        track = self.node_games.get(node_id)
        if not track or len(track) < 2:
            return None
        recent = [(t, g) for t, g in track if t >= track[-1][0] - RATE_WINDOW_S] or list(track)
        (t0, g0), (t1, g1) = recent[0], recent[-1]
        return round((g1 - g0) / (t1 - t0), 3) if t1 > t0 else None

    # -- what the page and the scrape read (event loop, memory only) --------------------
    def snapshot(self) -> dict[str, Any]:
        node = self.node
        view = node.cluster_view()
        inv = self._inventories()
        now = time.monotonic()
        alive = node.membership.alive_ids(now)
        nodes = []
        for nid in sorted(set(view.nodes) | set(node.voters) | {node.node_id}):
            state = view.nodes.get(nid)
            i = inv.get(nid, {})
            me = nid == node.node_id
            ready, why = self._ready(nid, i, alive)
            nodes.append({
                "node_id": nid, "self": me, "voter": nid in node.voters,
                "role": node.role.value if me else (state.role if state else "unknown"),
                "term": node.term if me else (state.term if state else None),
                "quorum_level": node.quorum_level.value if me else i.get("quorum_level"),
                "health": view.liveness.get(nid).value if view.liveness.get(nid) else ("alive" if me else "unknown"),
                "ready": ready, "ready_reason": why,
                "generation": self.pipe.state.best_generation if me else i.get("best_generation"),
                "model": self.pipe.state.best_sha256 if me else i.get("best_sha256"),
                "games": i.get("games_created"), "games_per_s": self.games_per_second(nid),
                "under_replicated": self._under_replicated(nid, i),
                "claims": [c.item_id for c in state.claims] if state else [],
            })
        work = self.cache.local_work if node.is_leader else \
            next((i.get("work") for nid, i in inv.items() if nid == view.leader and i.get("work")), None)
        claims = [{"item": c.item_id, "node": s.node_id, "term": c.token.term}
                  for s in view.nodes.values() for c in s.claims]
        not_ready = [n["node_id"] for n in nodes if n["voter"] and n["ready"] is not True]
        return {
            "cluster": {"leader": view.leader, "term": node.term, "quorum_level": node.quorum_level.value,
                        "voters": list(node.voters), "voters_alive": sorted(set(node.voters) & alive),
                        "voters_not_ready": not_ready, "quorum_size": len(node.voters) // 2 + 1},
            "nodes": nodes, "work": work, "claims": claims,
            "generations": (generations := self.generations(inv)),
            "elo_anchor": _anchor_summary(generations),  # what every Elo shown is relative to
            "series": list(self.series),
            **({"workload": self.cache.workload_panel} if self.cache.workload_panel is not None else {}),
        }

    def _under_replicated(self, node_id: str, inventory: dict[str, Any]) -> dict[str, Any] | None:
        """{games, oldest_s}: a node's own games held by fewer nodes than the replication
        factor, as its replication daemon counts them (None: no replication on that node)."""
        cluster = self.pipe.cluster
        rep = cluster.replication if node_id == self.node.node_id and cluster is not None else inventory.get("replication")
        if not isinstance(rep, dict) or "under_replicated" not in rep:
            return None
        return {"games": rep["under_replicated"], "oldest_s": rep.get("oldest_under_replicated_s"),
                "factor": rep.get("factor")}

    def _ready(self, node_id: str, inventory: dict[str, Any], alive: set[str]) -> tuple[bool | None, str]:
        """(ready, why not) of a node: this node's own readiness, another's as it gossips it
        (None: not known); a node not seen alive is not ready, whatever it last said."""
        if node_id == self.node.node_id:
            return self.readiness() if self.readiness is not None else (None, "")
        if node_id not in alive:
            return False, "not seen alive"
        ready = inventory.get("ready")
        return (bool(ready), str(inventory.get("ready_reason") or "")[:200]) if isinstance(ready, bool) else (None, "")

    def generations(self, inv: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Decided generations (cluster log, or the local registry on a lone node), each with
        the Elo interval, training loss and solved-position accuracy of its model wherever in
        the cluster they are."""
        cluster = self.pipe.cluster
        if cluster is not None:
            effective = cluster.effective_records()  # a rolled-back promotion shows as withdrawn
            records = [{"generation": r.generation, "sha256": r.sha256, "promoted": r.promoted,
                        "rolled_back": r.generation in cluster.rollbacks.records,
                        "reason": r.reason, "trained_by": r.trained_by, "elo": r.elo}
                       for r in (effective[g] for g in sorted(effective))]
        else:
            records = [dict(r) for r in self.cache.local_generations]
        return self.enrich(records, inv)

    def enrich(self, records: list[dict[str, Any]], inv: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Each record with elo, elo_low, elo_high, loss and accuracy ({exact, outcome} or None):
        a cluster's Elo from its records' games, else the rater's registry (gossiped)."""
        inv = inv if inv is not None else self._inventories()
        stats: dict[str, list] = {}
        for i in inv.values():
            stats.update(i.get("gen_stats") or {})
        stats.update(self.cache.local_stats)
        record_elo = self.record_elo()
        for r in records:
            row = stats_row(stats.get(r["sha256"]))
            elo, low, high, loss, exact, outcome = row + [None] * (STATS_FIELDS - len(row))
            fitted = record_elo.get(r["generation"])
            if fitted is not None:
                elo, low, high = fitted
                r["elo_anchor"] = self._record_anchors.get(r["generation"])
            elif r.get("elo") is not None:
                elo = r["elo"]
            accuracy = {"exact": exact, "outcome": outcome} if exact is not None and outcome is not None else None
            r.update(elo=elo, elo_low=low, elo_high=high, loss=loss, accuracy=accuracy)
        return records

    def record_elo(self) -> dict[int, list[float]]:
        """A cluster's generation -> [elo, low, high], fitted again whenever its decided records
        change (a new decision is rated on the next read, not 5 s later: the gauges never lose a
        series in between); a few ms for a hundred records, so the loop may do it."""
        cluster = self.pipe.cluster
        if cluster is None:
            return {}
        records = cluster.generations.records  # replaced, never changed in place, on every merge
        if self._record_elo[0] is not records:
            anchor = anchor_player(self.pipe.settings)
            try:
                rated = rate_generations(dict(records), anchor)
            except ValueError as exc:  # a fit that did not converge: no cluster Elo until the next decision
                log.warning("generation_elo_failed", error=str(exc))
                rated = {}
            self._record_elo = (records, {g: [r.elo, r.low, r.high] for g, r in rated.items()})
            self._record_anchors = generation_anchors(dict(records), anchor) if rated else {}
        return self._record_elo[1]

    def progress(self, base: dict[str, Any]) -> dict[str, Any]:
        """GET /progress: `base` (the cluster's decided records, or a lone node's registry
        report) with every generation rated as the dashboard shows it, and the best named."""
        out = dict(base)
        out["feedback"] = feedback_status(self.pipe)  # this node's feedback loops (feedback_apply.py)
        if self.pipe.cluster is not None:
            out["generations"] = self.generations()
            out["anchor"] = _anchor_summary(out["generations"])
            return out
        generations = [_registry_generation(m, self.pipe.node_id) for m in base.get("models", [])
                       if m["generation"] > 0 and m["status"] != "candidate"]
        current = next((m for m in base.get("models", []) if m.get("current")), None)
        out["generations"] = self.enrich(generations)
        out["best_generation"] = current["generation"] if current is not None else 0
        out["rolled_back"] = [g["generation"] for g in generations if g["rolled_back"]]
        out["anchor"] = _anchor_summary(out["generations"])
        return out

    def config_progress(self) -> dict[str, Any]:
        """This lineage's part of /progress and the dashboard on a node with several configs
        (memory only: the page's callable runs on the event loop)."""
        generations = self.generations()
        cluster = self.pipe.cluster
        best = cluster.target_best() if cluster is not None else None
        state = self.pipe.state
        return {"best_generation": best.generation if best is not None else state.best_generation,
                "current_best": best.sha256 if best is not None else state.best_sha256,
                "anchor": _anchor_summary(generations), "generations": generations}

    def mesh_gauges(self) -> dict[str, Any]:
        """The mesh and cluster state as gauges (daemons/metrics.MESH_VIEW_HELP names; a dict
        value is one series per label value, metrics.MESH_VIEW_LABELS names the label)."""
        node = self.node
        now = time.monotonic()
        alive = node.membership.alive_ids(now)
        inv = self._inventories()
        out: dict[str, Any] = {
            "term": node.term, "is_leader": 1 if node.is_leader else 0,
            "leader_known": 1 if node.leader_id is not None else 0,
            "voters": len(node.voters), "voters_alive": len(set(node.voters) & alive),
            "quorum_size": len(node.voters) // 2 + 1,
            "peers_alive": len((alive - {node.node_id}) & set(node.membership.peers)),
            "cluster_games_created": sum(int(i.get("games_created", 0) or 0) for i in inv.values()),
        }
        cluster = self.pipe.cluster
        best = cluster.target_best() if cluster is not None else None
        out["cluster_best_generation"] = best.generation if best is not None else self.pipe.state.best_generation
        if self.cache.best_installed_at is not None:
            out["best_model_installed_timestamp_seconds"] = self.cache.best_installed_at
        elo = model_elo(self.generations(inv), best.sha256 if best is not None else self.pipe.state.best_sha256)
        if elo:
            out["model_elo"] = elo
        return out


def model_elo(generations: list[dict[str, Any]], best_sha256: str | None) -> dict[str, float]:
    """{"best": Elo of the model the cluster plays with, "candidate": Elo of the newest decided
    generation}: two series however many generations there are (pure)."""
    out: dict[str, float] = {}
    best = next((g for g in generations if g["sha256"] == best_sha256), None)
    if best is not None and best.get("elo") is not None:
        out["best"] = float(best["elo"])
    newest = max(generations, key=lambda g: g["generation"], default=None)
    if newest is not None and newest.get("elo") is not None:
        out["candidate"] = float(newest["elo"])
    return out


def _anchor_summary(generations: list[dict[str, Any]]) -> str | None:
    """What the Elo values shown are relative to: one anchor, several (comma separated: the
    games form separate chains), or None with no rated generation."""
    named = sorted({g["elo_anchor"] for g in generations if g.get("elo") is not None and g.get("elo_anchor")})
    return ", ".join(named) if named else None


def _registry_generation(model: dict[str, Any], node_id: str) -> dict[str, Any]:
    """A lone node's registry entry (ModelEntry.to_json / progress_report) as a decided generation
    (a rolled-back promotion shows as withdrawn, as the cluster's effective records show it)."""
    rolled_back = model["status"] == "rolled_back"
    return {"generation": model["generation"], "sha256": model["sha256"],
            "promoted": model.get("promoted_at") is not None and not rolled_back, "rolled_back": rolled_back,
            "reason": model.get("reason", ""), "trained_by": node_id, "elo": model.get("elo"),
            "elo_anchor": model.get("elo_anchor")}
