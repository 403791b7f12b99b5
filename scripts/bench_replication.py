#!/usr/bin/env python
"""Replication lag and `under_replicated` over time, three local orchestrator nodes at the
fastest self-play config; prints ONE JSON object.

    python scripts/bench_replication.py --seconds 60 --compare

Three real nodes play with the fastest self-play settings (8 simulations, 16-game batches, no
rest, a tiny net) and the replication daemon's shipped settings (factor 2, prefetch, a round a
second, games pushed as they finish). Every `--sample-s` each node's `/status`
(`inventory.replication`) is read: `under_replicated`, the push's pending games and its lag
p50/p99. After `--seconds` production stops (the self-play workers are paused with SIGSTOP,
the nodes keep running) and the time until every node reports nothing under-replicated is the
drain time. Afterwards each game's lag is read from the DBs: from the end of the game (its
`finished_at`, on the node that played it) to its insertion on the (factor-1)-th other node
(all nodes share this machine's clock). `--compare` runs it again with the push off (anti-
entropy only, as before issue 45), side by side; `--no-prefetch` with the push on and prefetch
off (`factor` copies of each game instead of one on every node). Each run also reports the CPU
seconds of its production window, the orchestrators' (storing games, mesh, replication) apart
from their descendants' (the self-play workers), since games/s alone moves with others' work on
a shared machine.

    python scripts/bench_replication.py --seconds 60 --compare --no-prefetch
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import select  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402

from app.db.replay_db import GameRow, ReplayDB  # noqa: E402
from app.free_ports import free_ports  # noqa: E402
from tests.orchestrator_helpers import signal_descendants  # noqa: E402

IDS = ["n0", "n1", "n2"]
FACTOR = 2
# The fastest self-play config: 8 simulations, 16-game batches, no rest, a tiny net.
CONFIG = {"model": {"channels": 8, "blocks": 1}, "search": {"simulations": 8},
          "selfplay": {"concurrent_games": 16, "collect_workers": 1}, "replication": {"factor": FACTOR}}


def daemons(push: bool, prefetch: bool) -> dict:
    return {"daemons": {
        "selfplay": {"critical": True, "stop_timeout_s": 15,
                     "settings": {"batch_games": 16, "simulations": 8, "rest_s": 0.0}},
        "replication": {"settings": {"push": push, "prefetch": prefetch}},
    }}


def start(root: Path, push: bool, prefetch: bool) -> tuple[list[subprocess.Popen], list[Path], list[int]]:
    mesh, health = free_ports(3), free_ports(3)
    (root / "daemons.yaml").write_text(yaml.safe_dump(daemons(push, prefetch)))
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "MESH_SECRET": secrets.token_hex(16)}
    procs, dirs = [], []
    for i, nid in enumerate(IDS):
        data = root / nid
        data.mkdir(parents=True)
        peers = ",".join(f"{IDS[j]}@127.0.0.1:{mesh[j]}" for j in range(3) if j != i)
        cmd = [sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
               "--daemons", str(root / "daemons.yaml"), "--data-dir", str(data), "--node-id", nid,
               "--port", str(mesh[i]), "--health-port", str(health[i]), "--profile", "fast",
               "--priority", str(i), "--voters", ",".join(IDS), "--peers", peers, "--log-level", "WARNING"]
        log = open(data / "node.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        dirs.append(data)
    return procs, dirs, mesh


def stop(procs: list[subprocess.Popen]) -> None:
    signal_descendants(procs, signal.SIGCONT)
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def cpu_seconds(procs: list[subprocess.Popen]) -> dict[str, float]:
    """CPU seconds (user + system) so far of the orchestrator processes themselves (the mesh,
    storing the games their workers send back, replication's pushes, pulls and inserts, the
    other daemons) and of their descendants (the self-play workers, kept alive from batch to
    batch, and any run a node starts), summed over the nodes."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, used = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        parent[pid], used[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    roots = {p.pid for p in procs}

    def root_of(pid: int) -> int | None:
        seen = 0
        while pid not in roots and pid in parent and seen < 64:
            pid, seen = parent[pid], seen + 1
        return pid if pid in roots else None
    own = sum(used.get(r, 0.0) for r in roots)
    workers = sum(t for pid, t in used.items() if pid not in roots and root_of(pid) is not None)
    return {"orchestrators": own, "descendants": workers}


def replication(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as resp:
            return (json.loads(resp.read()).get("inventory") or {}).get("replication")
    except (OSError, ValueError):
        return None


def rows(data: Path) -> list[tuple[str, str, float, float]]:
    with ReplayDB(data / "games.db") as db, Session(db.engine) as session:
        return [tuple(r) for r in session.execute(  # type: ignore[misc]
            select(GameRow.uid, GameRow.node_id, GameRow.finished_at, GameRow.inserted_at))]


def own_games(data: Path) -> int:
    if not (data / "games.db").exists():
        return 0
    with ReplayDB(data / "games.db") as db:
        return db.count_by_node(data.name)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))], 3)


def sample(mesh: list[int], t0: float) -> dict:
    reps = {nid: replication(port) for nid, port in zip(IDS, mesh)}
    under = {nid: (r or {}).get("under_replicated") for nid, r in reps.items()}
    push = {nid: (r or {}).get("push") or {} for nid, r in reps.items()}
    return {"t": round(time.time() - t0, 1), "under_replicated": under,
            "pending": {nid: p.get("pending") for nid, p in push.items()},
            "lag_p99": {nid: (p.get("lag_s") or {}).get("p99") for nid, p in push.items()}}


def run(args: argparse.Namespace, push: bool, prefetch: bool = True) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_replication_") as tmp:
        procs, dirs, mesh = start(Path(tmp), push, prefetch)
        series: list[dict] = []
        try:
            deadline = time.time() + args.startup_timeout  # start-up: imports, election, first games
            while not all(own_games(d) for d in dirs):
                if time.time() > deadline:
                    raise SystemExit(f"no games on every node within {args.startup_timeout} s; logs in {tmp}")
                time.sleep(1)
            began, cpu_began = time.time(), cpu_seconds(procs)
            while time.time() < began + args.seconds:
                series.append(sample(mesh, began))
                time.sleep(args.sample_s)
            cpu_ended = cpu_seconds(procs)
            signal_descendants(procs, signal.SIGSTOP)  # production stops; the nodes replicate on
            ended = time.time()
            drained_after = None
            while time.time() < ended + args.drain_timeout:
                s = sample(mesh, began)
                series.append(s)
                if all(v == 0 for v in s["under_replicated"].values()):
                    drained_after = round(time.time() - ended, 1)
                    break
                time.sleep(args.sample_s)
        finally:
            stop(procs)
        copies: dict[str, dict[str, float]] = {}  # uid -> node -> inserted_at
        made: dict[str, tuple[str, float]] = {}  # uid -> (origin, finished_at)
        for nid, data in zip(IDS, dirs):
            for uid, origin, finished, inserted in rows(data):
                copies.setdefault(uid, {})[nid] = inserted
                made[uid] = (origin, finished)
    window = [u for u, (_, fin) in made.items() if began <= fin <= ended]
    lags, stored, moved, short = [], [], [], 0
    for uid in window:
        origin, finished = made[uid]
        others = sorted(at for nid, at in copies[uid].items() if nid != origin)
        if origin in copies[uid]:
            stored.append(copies[uid][origin] - finished)
        if len(others) >= FACTOR - 1:
            lags.append(others[FACTOR - 2] - finished)
            if origin in copies[uid]:
                moved.append(others[FACTOR - 2] - copies[uid][origin])
        else:
            short += 1
    production = [s for s in series if s["t"] <= args.seconds]
    under_max = max((max((v or 0) for v in s["under_replicated"].values()) for s in production), default=None)
    return {
        "push": push, "prefetch": prefetch, "window_s": round(ended - began, 1), "games_played": len(window),
        "games_per_s": round(len(window) / max(1e-9, ended - began), 2),
        "lag_s": {"p50": percentile(lags, 0.5), "p99": percentile(lags, 0.99),
                  "max": round(max(lags), 3) if lags else None, "n": len(lags),
                  "over_1s": sum(lag > 1.0 for lag in lags)},
        # the lag in two parts: game end -> the origin's DB; the origin's DB -> the (factor-1)-th peer
        "stored_s": {"p50": percentile(stored, 0.5), "p99": percentile(stored, 0.99)},
        "moved_s": {"p50": percentile(moved, 0.5), "p99": percentile(moved, 0.99)},
        "games_short_of_factor_at_end": short,
        # CPU of the production window; the orchestrators' (storing, mesh, replication) per game played
        "cpu_s": {k: round(cpu_ended[k] - cpu_began[k], 1) for k in cpu_began},
        "orchestrator_cpu_ms_per_game": round(1000 * (cpu_ended["orchestrators"] - cpu_began["orchestrators"])
                                              / max(1, len(window)), 2),
        "under_replicated_max_while_playing": under_max,
        "drained_to_zero_after_s": drained_after,
        "series": series[:: max(1, len(series) // 40)],  # about 40 samples over time
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0, help="production window after start-up")
    p.add_argument("--sample-s", type=float, default=1.0)
    p.add_argument("--drain-timeout", type=float, default=60.0)
    p.add_argument("--startup-timeout", type=float, default=240.0)
    p.add_argument("--compare", action="store_true", help="also run with the push off (anti-entropy only)")
    p.add_argument("--no-prefetch", action="store_true",
                   help="also run with the push on and prefetch off: `factor` copies of a game, not one on every node")
    args = p.parse_args()
    out = {"bench": "replication", "nodes": len(IDS), "factor": FACTOR, "cores": os.cpu_count(),
           "config": {"simulations": 8, "batch_games": 16, "model": CONFIG["model"]},
           "load_avg_1m": round(os.getloadavg()[0], 2), "runs": [run(args, push=True)]}
    if args.no_prefetch:
        out["runs"].append(run(args, push=True, prefetch=False))
    if args.compare:
        out["runs"].append(run(args, push=False))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
