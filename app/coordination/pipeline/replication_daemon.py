"""The replication daemon: every finished game on at least `replication.factor` nodes.

Two loops. The push loop (app/coordination/sync/replica_push.py) sends each game this node
finishes to its holders the moment it is stored: it looks every `push_poll_s` (and at once when
self-play publishes NEW_ITEMS_AVAILABLE), so a node that dies loses at most what it made in
the last instant. Anti-entropy rounds (app/coordination/sync/replication.py) are the repair:
each pulls from the alive peers the games this node should hold (and, with `prefetch`, the
rest, so a claimant exports without a long pull), then publishes what it found: the node's
inventory gossips `replication` (held, own, under_replicated, oldest age, which peers hold how
many of its own games, and `push`: the replication lag p50/p99 of its latest games and what is
still pending), which GET /status shows, and the metrics `mesh_games_under_replicated`,
`mesh_games_under_replicated_oldest_age_seconds`, `mesh_replication_lag_seconds` (histogram)
and `mesh_replication_pending_oldest_seconds`.
On a lone node there is nothing to replicate: the factor is 1 and the daemon only idles.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import Field

from app.config import StrictModel
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.events import EventType
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline.context import PipelineContext, wake_on
from app.coordination.sync.ranges import effective_factor
from app.coordination.sync.replica_push import Pusher
from app.coordination.sync.replication import Replicator, RoundReport
from app.coordination.sync.wire import MAX_FETCH_UIDS


class ReplicationSettings(StrictModel):
    """daemons.yaml `replication.settings` (the factor itself is node config: replication.factor)."""

    interval_s: float = Field(1.0, gt=0)  # between rounds
    prefetch: bool = True  # after the placed share, pull the remaining games too
    batch_games: int = Field(128, ge=1, le=MAX_FETCH_UIDS)  # games per fetch request
    max_bytes_per_s: float = Field(8e6, gt=0)  # average pull rate cap
    max_games_per_round: int = Field(500, ge=1)  # bounds a round (and its heartbeat gap)
    list_max: int = Field(128, ge=1, le=5000)  # a differing range this small is listed, not split
    timeout_s: float = Field(10.0, gt=0)  # per request
    push: bool = True  # send each game this node finishes to its holders at once (off: anti-entropy only)
    push_poll_s: float = Field(0.05, gt=0, le=10)  # how often the push loop looks for new games of its own
    push_max_bytes: int = Field(512 * 1024, ge=4096, le=1 << 20)  # games' JSON per push request


async def replication_daemon(pipe: PipelineContext, ctx: DaemonContext[ReplicationSettings]) -> None:
    cfg = ctx.settings
    cluster = pipe.cluster
    if cluster is None:  # lone node: one copy is the factor
        ctx.metrics.games_under_replicated.set(0)
        while True:
            ctx.mark_healthy()  # idle but alive (daemons.yaml may set a heartbeat timeout)
            if await ctx.sleep(30.0):
                return
    node = cluster.node
    factor = effective_factor(pipe.settings.replication.factor, clustered=True)
    store_name, store = await asyncio.to_thread(pipe.steps.items.replica)  # games, or LM rollouts
    replicator = Replicator(
        pipe.node_id, node.client, store, factor=factor, store_name=store_name, prefetch=cfg.prefetch,
        batch=cfg.batch_games,
        max_bytes_per_s=cfg.max_bytes_per_s, max_records_per_round=cfg.max_games_per_round,
        list_max=cfg.list_max, timeout=cfg.timeout_s,
    )
    pusher = Pusher(pipe.node_id, node.client, store, factor=factor, store_name=store_name, prefetch=cfg.prefetch,
                    max_bytes=cfg.push_max_bytes, timeout=cfg.timeout_s)
    pusher.on_replicated = ctx.metrics.replication_lag_seconds.observe
    pushing = asyncio.create_task(push_loop(node, pusher, replicator, cfg.push_poll_s,
                                            wake_on(ctx, EventType.NEW_ITEMS_AVAILABLE), ctx,
                                            cluster)) if cfg.push else None
    ctx.mark_healthy()
    try:
        while not ctx.stopping.is_set():
            report = await one_round(node, replicator, factor)
            status = report.status
            push = pusher.status()
            cluster.replication = {**status.to_json(), "push": push.to_json()}  # gossiped with the inventory
            ctx.metrics.replication_pending_oldest_seconds.set(push.oldest_pending_s or 0.0)
            ctx.metrics.games_under_replicated.set(status.under_replicated)
            ctx.metrics.games_under_replicated_oldest_age_seconds.set(status.oldest_under_replicated_s or 0.0)
            if report.pulled:
                ctx.metrics.replication_pulled_games_total.inc(report.pulled)
                ctx.log.debug("games_replicated", pulled=report.pulled, bytes=report.bytes_in,
                              under_replicated=status.under_replicated)
            if report.bytes_in:
                ctx.metrics.replication_received_bytes_total.inc(report.bytes_in)
            ctx.mark_healthy()
            if await ctx.sleep(cfg.interval_s):
                return
    finally:
        if pushing is not None:
            pushing.cancel()
            await asyncio.gather(pushing, return_exceptions=True)
            await pusher.close()
        await asyncio.to_thread(store.close)


async def push_loop(node: MeshNode, pusher: Pusher, replicator: Replicator, poll_s: float, wake: asyncio.Event,
                    ctx: DaemonContext, cluster: Any, publish_s: float = 0.5) -> None:
    """Push this node's new games every `poll_s`, or at once when self-play says it stored some;
    what is pending and the lag reach /status every `publish_s` (not only once a round)."""
    published = 0.0
    while not ctx.stopping.is_set():
        wake.clear()
        try:
            view = node.cluster_view()
            members = sorted({s.node_id for s in view.alive()} | {node.node_id})
            pusher.factor = replicator.factor  # capped at the cluster's size by the anti-entropy round
            peers = {p: a for p in members if p != node.node_id and (a := node.addr_of(p))}
            await pusher.push_new(peers, members, wait=False)
        except Exception:  # noqa: BLE001 - a failed push is retried; anti-entropy repairs meanwhile
            ctx.log.exception("replication_push_round_failed")
        if time.monotonic() - published >= publish_s and cluster.replication is not None:
            published = time.monotonic()
            push = pusher.status()
            cluster.replication = {**cluster.replication, "push": push.to_json()}
            ctx.metrics.replication_pending_oldest_seconds.set(push.oldest_pending_s or 0.0)
        try:
            await asyncio.wait_for(wake.wait(), poll_s)
        except TimeoutError:
            pass


async def one_round(node: MeshNode, replicator: Replicator, factor: int) -> RoundReport:
    """One anti-entropy round against the alive peers. Also what a claimant may run before its
    export instead of a cursor pull: with prefetch the games are already here, and a round
    compares digests instead of paging every peer's manifest."""
    view = node.cluster_view()
    members = sorted({s.node_id for s in view.alive()} | {node.node_id})
    # never more copies than nodes the cluster has (alive or not): a two-node team with
    # factor 3 would otherwise count every game as under-replicated for ever
    replicator.factor = max(1, min(factor, len(set(view.nodes) | {node.node_id})))
    peers = {p: a for p in members if p != node.node_id and (a := node.addr_of(p))}
    return await replicator.run_round(peers, members)
