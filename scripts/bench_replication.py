#!/usr/bin/env python
"""Replication lag and bytes moved per game on three local orchestrator nodes.

    python scripts/bench_replication.py --seconds 120

Three real nodes play (self-play and the replication daemon with its shipped settings:
factor 2, a round per second, prefetch on). Afterwards each game's lag is read from the DBs:
the time from its insertion on the node that played it to its insertion on the (factor-1)-th
other node, i.e. until it exists on `factor` nodes (all nodes share this machine's clock).
Bytes are what the replication daemons received (`mesh_replication_received_bytes_total`,
digests, id lists and games), per game played. Prints one JSON object.
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

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.replay_db import GameRow, ReplayDB
from app.free_ports import free_ports

IDS = ["n0", "n1", "n2"]
FACTOR = 2
CONFIG = {"model": {"channels": 16, "blocks": 1}, "search": {"simulations": 4},
          "selfplay": {"concurrent_games": 8}, "replication": {"factor": FACTOR}}
DAEMONS = {"daemons": {
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 8}},
    "replication": {},
}}
SETTLE_S = 5.0  # games younger than this at the end are not counted (they may still be in flight)


def start(root: Path) -> tuple[list[subprocess.Popen], list[Path], list[int]]:
    mesh, health = free_ports(3), free_ports(3)
    (root / "daemons.yaml").write_text(yaml.safe_dump(DAEMONS))
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
               "--priority", str(i), "--voters", ",".join(IDS), "--peers", peers]
        log = open(data / "node.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        dirs.append(data)
    return procs, dirs, health


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def metric(port: int, name: str) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return 0.0
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def rows(data: Path) -> list[tuple[str, str, float, int]]:
    with ReplayDB(data / "games.db") as db, Session(db.engine) as session:
        return [tuple(r) for r in session.execute(
            select(GameRow.uid, GameRow.node_id, GameRow.inserted_at, GameRow.length))]


def own_games(data: Path) -> int:
    if not (data / "games.db").exists():
        return 0
    with ReplayDB(data / "games.db") as db:
        return db.count_by_node(data.name)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="measurement window after start-up")
    p.add_argument("--startup-timeout", type=float, default=240.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_replication_") as tmp:
        procs, dirs, health = start(Path(tmp))
        try:
            deadline = time.time() + args.startup_timeout  # start-up: imports, election, first games
            while not all(own_games(d) for d in dirs):
                if time.time() > deadline:
                    raise SystemExit(f"no games on every node within {args.startup_timeout} s; logs in {tmp}")
                time.sleep(1)
            bytes_before = sum(metric(h, "mesh_replication_received_bytes_total") for h in health)
            began = time.time()
            time.sleep(args.seconds)
            ended = time.time()
            bytes_after = sum(metric(h, "mesh_replication_received_bytes_total") for h in health)
        finally:
            stop(procs)
        copies: dict[str, dict[str, float]] = {}  # uid -> node -> inserted_at
        origin_of: dict[str, str] = {}
        for nid, data in zip(IDS, dirs):
            for uid, origin, at, _ in rows(data):
                copies.setdefault(uid, {})[nid] = at
                origin_of[uid] = origin
        with ReplayDB(dirs[0] / "games.db") as db:  # one game's own size, as JSON on the wire
            sizes = [len(json.dumps(g.to_json())) for g in db.games(newest=200)]
    made = [u for u in copies if began <= copies[u].get(origin_of[u], 0.0) <= ended - SETTLE_S]
    lags, short = [], 0
    for uid in made:
        t0 = copies[uid][origin_of[uid]]
        others = sorted(at for nid, at in copies[uid].items() if nid != origin_of[uid])
        if len(others) >= FACTOR - 1:
            lags.append(others[FACTOR - 2] - t0)
        else:
            short += 1
    played = [u for u in copies if began <= copies[u].get(origin_of[u], 0.0) <= ended]
    print(json.dumps({
        "nodes": len(IDS), "factor": FACTOR, "window_s": round(ended - began, 1),
        "games_played": len(played), "games_measured": len(made),
        "games_short_of_factor": short,
        "lag_s": {"median": round(statistics.median(lags), 2) if lags else None,
                  "p99": round(percentile(lags, 0.99), 2) if lags else None,
                  "max": round(max(lags), 2) if lags else None},
        "game_json_bytes_mean": round(statistics.mean(sizes)) if sizes else None,
        "bytes_received": int(bytes_after - bytes_before),
        "bytes_per_game_played": round((bytes_after - bytes_before) / len(played)) if played else None,
        # what a claimant would still have to pull at claim time (games of the window it lacks)
        "claimant_would_pull_max": max(sum(1 for u in made if nid not in copies[u]) for nid in IDS) if made else None,
        "copies_per_game_at_end": round(sum(len(copies[u]) for u in made) / len(made), 2) if made else None,
        "cores": os.cpu_count(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
