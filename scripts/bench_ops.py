#!/usr/bin/env python
"""Operator-facing speed: the dashboard page, its data and /metrics at p99 with 7 nodes and 100
generations, and the leader's work queue on PostgreSQL under 100 simulated workers.

    python scripts/bench_ops.py [--requests 400] [--cycles 3000] [--no-postgres]
    python scripts/bench_ops.py --snapshot      snapshot time and size, the pause a running node sees

Prints one JSON object. Dashboard and metrics: one real node process-side stack (MeshNode,
ClusterPipeline, DashboardFeed, DaemonManager with 8 daemons, HealthServer) in this process;
six peers' gossiped states (inventories with 100 decided generations and their stats) are
merged into its membership, and 100 generations' Elo gauges set, so every byte is produced by
the same code as in production. Requests are sequential over loopback HTTP (client time included);
`cpu_*` is the process CPU time per request (client and server share the process), the part a
busy machine does not inflate; `load_average_1m` says how busy it was.

Work queue: WorkQueue on a fresh PostgreSQL server (initdb in a temp dir, like the tests) and on
SQLite for comparison; 100 worker ids take turns doing a whole claim cycle the way the leader
serves them (claim, renew, complete: three transactions; `leader_cpu_ms_per_cycle` is this
process's CPU per cycle, the database server's not included), with two items per worker queued and
the leader's reconcile topping the queue up after every 100 cycles. Target: >= 100 cycles/s, i.e. each
of 100 workers finishing one item per second, far shorter than any real item.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config import Settings  # noqa: E402
from app.coordination.daemons.event_router import EventRouter  # noqa: E402
from app.coordination.daemons.health_server import HealthServer  # noqa: E402
from app.coordination.daemons.manager import DaemonManager  # noqa: E402
from app.coordination.daemons.metrics import Metrics  # noqa: E402
from app.coordination.daemons.daemon_registry import build_registry  # noqa: E402
from app.coordination.p2p.node import MeshNode  # noqa: E402
from app.coordination.p2p.schemas import NodeState  # noqa: E402
from app.coordination.p2p.work_queue import WorkQueue  # noqa: E402
from app.coordination.p2p.work_rules import WorkSpec  # noqa: E402
from app.coordination.pipeline.cluster import ClusterPipeline  # noqa: E402
from app.coordination.pipeline.runner_settings import ExportSettings  # noqa: E402
from app.workloads import pipeline_context  # noqa: E402
from app.coordination.pipeline.dashboard_feed import DashboardFeed  # noqa: E402
from app.log import configure_logging  # noqa: E402
from tests.mesh_helpers import free_ports  # noqa: E402

NODES, GENERATIONS, DAEMONS = 7, 100, 8


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _records() -> list[dict]:
    return [{"generation": g, "sha256": f"{g:064x}", "promoted": g % 3 != 0, "games_mark": 1000 * g,
             "trained_by": f"n{g % NODES}", "reason": "pass: score vs random 0.97; pass: SPRT accepts H1",
             "elo": 100.0 + 9.0 * g} for g in range(1, GENERATIONS + 1)]


async def _idle_daemon(ctx) -> None:  # type: ignore[no-untyped-def]
    ctx.mark_healthy()
    await ctx.stopping.wait()


async def bench_dashboard(requests: int) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="bench-ops-"))
    ports = free_ports(NODES)
    ids = [f"n{i}" for i in range(NODES)]
    settings = Settings.model_validate({
        "node": {"node_id": "n0", "data_dir": str(tmp), "mesh_port": ports[0], "health_port": 0},
        "mesh": {"peers": [f"{ids[i]}@127.0.0.1:{ports[i]}" for i in range(1, NODES)], "voters": ids,
                 "profile": "lan", "secret": "bench-secret"},
    })
    records = _records()
    (tmp / "generations.json").write_text(json.dumps(records))
    metrics = Metrics(node="n0")
    pipe = pipeline_context(settings, export=ExportSettings(min_new_games=100))
    node = MeshNode(settings, registry=metrics.registry)
    cluster = ClusterPipeline(node, pipe)
    pipe.cluster = cluster
    node.add_routes(cluster.routes())
    router = EventRouter(metrics=metrics)
    registry = build_registry({"daemons": {f"d{i}": {"critical": i < 6} for i in range(DAEMONS)}},
                              {f"d{i}": (_idle_daemon, {}) for i in range(DAEMONS)})
    manager = DaemonManager(registry.select("all"), router=router, settings=settings, metrics=metrics)
    feed = DashboardFeed(pipe, node)
    metrics.watch_daemons(manager.daemon_states)
    metrics.watch_mesh(feed.mesh_gauges)
    for r in records:
        metrics.elo.labels(generation=str(r["generation"])).set(r["elo"])
    health = HealthServer(manager, metrics, port=0, dashboard=feed.snapshot)
    await node.start()
    await health.start()
    await manager.start()
    try:
        stats = {r["sha256"]: [r["elo"], r["elo"] - 40, r["elo"] + 40, 2.0 - r["generation"] / 100] for r in records}
        now = time.monotonic()
        for i in range(1, NODES):
            node.membership.merge_state(NodeState(
                node_id=ids[i], addr=f"127.0.0.1:{ports[i]}", incarnation=1, version=1, role="follower",
                term=node.term, voter=True, capabilities={"cpus": 2, "gpus": 0, "memory_gb": 8.0},
                inventory={"games_created": 5000 * i, "positions_created": 90000 * i, "best_generation": GENERATIONS,
                           "best_sha256": records[-1]["sha256"], "generations": records, "gen_stats": stats,
                           "quorum_level": "healthy"}), now)
        t0 = time.time()
        for k in range(720):  # a full hour of samples in the games/positions series
            feed.sample(t0 - 5 * (720 - k))
        timings: dict[str, list[float]] = {"/": [], "/dashboard.json": [], "/metrics": []}
        cpu: dict[str, list[float]] = {path: [] for path in timings}
        sizes: dict[str, int] = {}
        async with aiohttp.ClientSession() as http:
            for path in timings:  # warm-up
                async with http.get(health.url + path) as resp:
                    sizes[path] = len(await resp.read())
            for _ in range(requests):
                for path, samples in timings.items():
                    start, start_cpu = time.perf_counter(), time.process_time()
                    async with http.get(health.url + path) as resp:
                        await resp.read()
                        assert resp.status == 200, (path, resp.status)
                    samples.append((time.perf_counter() - start) * 1000)
                    cpu[path].append((time.process_time() - start_cpu) * 1000)
        snapshot = feed.snapshot()
        assert len(snapshot["nodes"]) == NODES and len(snapshot["generations"]) == GENERATIONS
        return {path: {"p50_ms": round(statistics.median(s), 2), "p99_ms": round(pct(s, 0.99), 2),
                       "cpu_p50_ms": round(statistics.median(cpu[path]), 2), "cpu_p99_ms": round(pct(cpu[path], 0.99), 2),
                       "bytes": sizes[path]} for path, s in timings.items()}
    finally:
        await manager.drain_and_stop(deadline_s=5)
        await health.stop()
        await node.stop()


def bench_queue(target: str | Path, cycles: int, workers: int = 100) -> dict:
    queue = WorkQueue(target, max_attempts=3, default_ttl=30.0)
    try:
        batch = 2 * workers  # what the leader keeps queued: a couple of items per worker

        def wanted(first: int) -> list[WorkSpec]:
            return [WorkSpec("demo", f"item-{i}") for i in range(first, first + batch)]

        queue.rebuild(1, wanted(0), [], [], now=0.0)
        latencies: list[float] = []
        start, start_cpu = time.perf_counter(), time.process_time()
        done = 0
        for i in range(cycles):
            worker, now = f"w{i % workers}", 1.0 + i * 1e-3
            if i and i % workers == 0:  # the leader's reconcile: finished items out, new ones in
                queue.reconcile(wanted(i), now=now)
            t = time.perf_counter()
            grant = queue.claim(worker, {}, None, term=1, now=now)
            if grant is None:
                break
            refusal, _ = queue.renew(worker, grant.item.item_id, grant.token, 1, True, now)
            assert refusal is None, refusal
            assert queue.finish(worker, grant.item.item_id, grant.token, 1, True, now, ok=True) is None
            latencies.append((time.perf_counter() - t) * 1000)
            done += 1
        elapsed, cpu_s = time.perf_counter() - start, time.process_time() - start_cpu
        return {"workers": workers, "leader_cpu_ms_per_cycle": round(1000 * cpu_s / max(done, 1), 2), "cycles": done, "cycles_per_s": round(done / elapsed, 1),
                "transactions_per_s": round(3 * done / elapsed, 1),
                "cycle_p50_ms": round(statistics.median(latencies), 2), "cycle_p99_ms": round(pct(latencies, 0.99), 2),
                "meets_100_workers_at_1_per_s": done / elapsed >= workers}
    finally:
        queue.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=400, help="requests per endpoint")
    ap.add_argument("--cycles", type=int, default=3000, help="claim cycles per backend")
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--snapshot", action="store_true",
                    help="only the snapshot figures (scripts/bench_snapshot.py): time and size by data dir, "
                         "and self-play positions/s of a live node before and during snapshots")
    ap.add_argument("--pause-window-s", type=float, default=30.0, help="--snapshot: seconds per measured window")
    ap.add_argument("--pause-rounds", type=int, default=3, help="--snapshot: before/during pairs")
    args = ap.parse_args(argv)
    configure_logging("n0", level="WARNING")  # logs to stderr: stdout is the one JSON object
    if args.snapshot:
        from scripts.bench_snapshot import bench_pause, bench_sizes

        out = {"load_average_1m": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
               "snapshot_sizes": bench_sizes([(1000, 1), (10000, 5), (30000, 20)]),
               "snapshot_pause": bench_pause(20000, args.pause_window_s, args.pause_rounds)}
        out["load_average_1m_after"] = round(os.getloadavg()[0], 1)
        print(json.dumps(out))
        return 0
    out: dict = {"load_average_1m": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
                 "nodes": NODES, "generations": GENERATIONS, "daemons": DAEMONS,
                 "dashboard": asyncio.run(bench_dashboard(args.requests))}
    with tempfile.TemporaryDirectory() as tmp:
        out["work_queue_sqlite"] = bench_queue(Path(tmp) / "q.db", args.cycles)
    if not args.no_postgres:
        from tests.db_backends import PostgresServer

        server = PostgresServer(durable=True)
        try:
            server.start()
            out["work_queue_postgresql"] = bench_queue(server.create_database(), args.cycles)
        finally:
            server.stop()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
