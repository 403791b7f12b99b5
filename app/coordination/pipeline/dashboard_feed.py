"""What the dashboard and the mesh gauges show, gathered from the mesh and the pipeline.

The health server (daemons layer) may not import the mesh or the pipeline, so the orchestrator
hands it two callables from here: `DashboardFeed.snapshot` (GET /dashboard.json) and
`DashboardFeed.mesh_gauges` (scraped as `mesh_term`, `mesh_voters_alive`, ...). Both run on the
event loop and only read memory: everything that touches a file (registry ratings, training
results, games in the replay DB) is read by `run()` in a worker thread every few seconds and
cached, so a page view or a scrape never waits on SQLite.

Per-generation Elo intervals and training losses live where the candidate was trained and
evaluated; `generation_stats()` reads them there and every node gossips its own
(`gen_stats` in its inventory), so any node's dashboard can chart every generation.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config.paths import NodePaths
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline.context import PipelineContext
from app.db.registry import ModelRegistry, RegistryError
from app.log import get_logger

log = get_logger(__name__)

HISTORY_POINTS = 720  # a point per sample: an hour at the default 5 s
STATS_GOSSIPED = 100  # newest models whose Elo/loss a node gossips
STATS_TTL_S = 5.0
RATE_WINDOW_S = 60.0


# -- per-node generation stats, gossiped -------------------------------------------------
_stats_cache: dict[Path, tuple[float, dict[str, list]]] = {}
_stats_lock = threading.Lock()


def generation_stats(paths: NodePaths, ttl_s: float = STATS_TTL_S) -> dict[str, list]:
    """{sha256: [elo, elo_low, elo_high, loss]} of the models this node registered or trained
    (newest STATS_GOSSIPED); cached for `ttl_s` since the inventory asks every second."""
    now = time.monotonic()
    with _stats_lock:
        hit = _stats_cache.get(paths.data_dir)
        if hit is not None and now - hit[0] < ttl_s:
            return hit[1]
    stats: dict[str, list] = {}
    for sha, loss in _training_losses(paths.runs_dir).items():
        stats[sha] = [None, None, None, loss]
    if paths.registry_db.exists():
        try:
            with ModelRegistry(paths.registry_db, create=False) as registry:
                for m in registry.models():
                    if m.elo is not None:
                        loss = stats.get(m.sha256, [None] * 4)[3]
                        stats[m.sha256] = [m.elo, m.elo_low, m.elo_high, loss]
        except RegistryError as exc:
            log.warning("dashboard_registry_unreadable", error=str(exc))
    newest = dict(list(stats.items())[-STATS_GOSSIPED:])
    with _stats_lock:
        _stats_cache[paths.data_dir] = (now, newest)
    return newest


def _training_losses(runs_dir: Path) -> dict[str, float]:
    """candidate sha256 -> best held-out loss, from each run's result.json."""
    out: dict[str, float] = {}
    if not runs_dir.is_dir():
        return out
    for result in sorted(runs_dir.glob("gen_*/result.json")):
        try:
            data = json.loads(result.read_text())
        except (OSError, ValueError):
            continue  # being written, or not ours: skip, the next sample reads it
        sha, loss = data.get("candidate_sha256"), data.get("best_holdout_loss")
        if isinstance(sha, str) and isinstance(loss, (int, float)):
            out[sha] = float(loss)
    return out


# -- the feed ------------------------------------------------------------------------------
@dataclass
class _Cache:
    """What run() last read from disk."""

    local_generations: list[dict[str, Any]] = field(default_factory=list)  # single node: from the registry
    local_stats: dict[str, list] = field(default_factory=dict)
    local_games: int = 0
    local_positions: int = 0
    best_installed_at: float | None = None


class DashboardFeed:
    def __init__(self, pipe: PipelineContext, node: MeshNode, history: int = HISTORY_POINTS) -> None:
        self.pipe = pipe
        self.node = node
        self.cache = _Cache()
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
        best = self.pipe.state.best_sha256
        if best is not None:
            try:
                cache.best_installed_at = os.stat(self.pipe.steps.models.installed_path(best)).st_mtime
            except OSError:
                cache.best_installed_at = None
        if self.pipe.cluster is None and paths.registry_db.exists():
            try:
                with ModelRegistry(paths.registry_db, create=False) as registry:
                    cache.local_generations = [
                        {"generation": m.generation, "sha256": m.sha256, "promoted": m.promoted_at is not None, "reason": m.reason, "trained_by": self.pipe.node_id}
                        for m in registry.models() if m.generation > 0]
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
            nodes.append({
                "node_id": nid, "self": me, "voter": nid in node.voters,
                "role": node.role.value if me else (state.role if state else "unknown"),
                "term": node.term if me else (state.term if state else None),
                "quorum_level": node.quorum_level.value if me else i.get("quorum_level"),
                "health": view.liveness.get(nid).value if view.liveness.get(nid) else ("alive" if me else "unknown"),
                "generation": self.pipe.state.best_generation if me else i.get("best_generation"),
                "model": self.pipe.state.best_sha256 if me else i.get("best_sha256"),
                "games": i.get("games_created"), "games_per_s": self.games_per_second(nid),
                "claims": [c.item_id for c in state.claims] if state else [],
            })
        work = next((i.get("work") for nid, i in inv.items() if nid == view.leader and i.get("work")), None)
        claims = [{"item": c.item_id, "node": s.node_id, "term": c.token.term}
                  for s in view.nodes.values() for c in s.claims]
        return {
            "cluster": {"leader": view.leader, "term": node.term, "quorum_level": node.quorum_level.value,
                        "voters": list(node.voters), "voters_alive": sorted(set(node.voters) & alive),
                        "quorum_size": len(node.voters) // 2 + 1},
            "nodes": nodes, "work": work, "claims": claims,
            "generations": self.generations(inv),
            "series": list(self.series),
        }

    def generations(self, inv: dict[str, dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """Decided generations (cluster log, or the local registry on a lone node), each with
        the Elo interval and training loss of its candidate wherever in the cluster they are."""
        inv = inv if inv is not None else self._inventories()
        stats: dict[str, list] = {}
        for i in inv.values():
            stats.update(i.get("gen_stats") or {})
        stats.update(self.cache.local_stats)
        cluster = self.pipe.cluster
        if cluster is not None:
            effective = cluster.effective_records()  # a rolled-back promotion shows as withdrawn
            records = [{"generation": r.generation, "sha256": r.sha256, "promoted": r.promoted,
                        "rolled_back": r.generation in cluster.rollbacks.records,
                        "reason": r.reason, "trained_by": r.trained_by, "elo": r.elo}
                       for r in (effective[g] for g in sorted(effective))]
        else:
            records = [dict(r) for r in self.cache.local_generations]
        for r in records:
            elo, low, high, loss = (stats.get(r["sha256"]) or [None] * 4)[:4]
            r.update(elo=r.get("elo") if r.get("elo") is not None else elo, elo_low=low, elo_high=high, loss=loss)
        return records

    def mesh_gauges(self) -> dict[str, float]:
        """The mesh and cluster state as gauges (daemons/metrics.MESH_VIEW_HELP names)."""
        node = self.node
        now = time.monotonic()
        alive = node.membership.alive_ids(now)
        inv = self._inventories()
        out: dict[str, float] = {
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
        return out
