#!/usr/bin/env python
"""Cluster throughput and model-distribution latency on local nodes.

    python scripts/bench_cluster.py --seconds 90

1. Self-play positions per second of 1, 2 and 3 local orchestrator nodes (self-play and
   distribution daemons only), each measured over the same wall time; the scaling ratio is
   against one node. On one 2-core machine the ceiling is about 2x: this measures the
   mesh's overhead, not a real multi-machine speed-up.
2. Seconds from a promotion's quorum commit (the leader's `generation_committed` log line)
   to every node playing the new model (`model_switched` on each node), on 3 full nodes.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.db.replay_db import ReplayDB  # noqa: E402
from app.free_ports import free_ports  # noqa: E402

CONFIG = {
    "model": {"channels": 16, "blocks": 1}, "search": {"simulations": 16},
    "selfplay": {"concurrent_games": 32}, "train": {"batch_size": 128, "epochs": 2},
    "gauntlet": {"games_vs_baseline": 8, "max_games_vs_best": 16, "net_simulations": 8},
    "promotion": {"min_score_vs_random": 0.5, "min_score_vs_heuristic": None},
}
SELFPLAY_ONLY = {"daemons": {
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 32}},
    "distribution": {"settings": {"poll_s": 1}},
}}
FULL = {"daemons": {
    "selfplay": {"critical": True, "stop_timeout_s": 15, "settings": {"batch_games": 16}},
    "export": {"settings": {"min_new_games": 90, "poll_s": 0.5}},
    "train": {"depends_on": ["export"], "settings": {"poll_s": 0.5}},
    "gauntlet": {"depends_on": ["train"], "settings": {"poll_s": 0.5}},
    "promote": {"depends_on": ["gauntlet"], "settings": {"poll_s": 0.5}},
    "distribution": {"settings": {"poll_s": 0.5}},
}}


def start_cluster(root: Path, n: int, daemons: dict) -> tuple[list[subprocess.Popen], list[Path]]:
    ids = [f"n{i}" for i in range(n)]
    mesh, health = free_ports(n), free_ports(n)
    (root / "daemons.yaml").write_text(yaml.safe_dump(daemons))
    (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    env = {**os.environ, "MESH_SECRET": secrets.token_hex(16)}
    procs, dirs = [], []
    for i, nid in enumerate(ids):
        data = root / nid
        data.mkdir(parents=True)
        cmd = [sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
               "--daemons", str(root / "daemons.yaml"), "--data-dir", str(data), "--node-id", nid,
               "--port", str(mesh[i]), "--health-port", str(health[i]), "--profile", "fast", "--priority", str(i)]
        if n > 1:
            peers = ",".join(f"{ids[j]}@127.0.0.1:{mesh[j]}" for j in range(n) if j != i)
            cmd += ["--voters", ",".join(ids), "--peers", peers]
        log = open(data / "node.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
        dirs.append(data)
    return procs, dirs


def stop_cluster(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=40)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


def own_positions(data: Path) -> int:
    db_path = data / "games.db"
    if not db_path.exists():
        return 0
    with ReplayDB(db_path) as db:
        return db.count_positions(node_id=data.name)


def throughput(n: int, seconds: float) -> float:
    with tempfile.TemporaryDirectory(prefix=f"bench_cluster_{n}_") as tmp:
        procs, dirs = start_cluster(Path(tmp), n, SELFPLAY_ONLY)
        try:
            time.sleep(15)  # start-up: imports, worker spawn, first batch
            before = sum(own_positions(d) for d in dirs)
            time.sleep(seconds)
            after = sum(own_positions(d) for d in dirs)
        finally:
            stop_cluster(procs)
    return (after - before) / seconds


def _events(path: Path, name: str) -> list[dict]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def distribution_latency(timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench_cluster_dist_") as tmp:
        procs, dirs = start_cluster(Path(tmp), 3, FULL)
        try:
            deadline = time.time() + timeout
            while time.time() < deadline:
                commits = [e for d in dirs for e in _events(d / "node.log", "generation_committed")
                           if e.get("promoted")]
                if commits:
                    sha = commits[0]["sha256"]
                    switches = [next((e for e in _events(d / "node.log", "model_switched")
                                      if sha.startswith(e["sha256"])), None) for d in dirs]
                    if all(switches):
                        lags = [_ts(s) - _ts(commits[0]) for s in switches]
                        return {"generation": commits[0]["generation"], "seconds_to_all_nodes": round(max(lags), 2),
                                "per_node_s": [round(x, 2) for x in lags]}
                time.sleep(1)
            return {"error": f"no promotion reached all nodes within {timeout}s"}
        finally:
            stop_cluster(procs)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=90.0, help="measurement window per cluster size")
    p.add_argument("--timeout", type=float, default=400.0, help="limit for the distribution run")
    args = p.parse_args()
    rates = {n: throughput(n, args.seconds) for n in (1, 2, 3)}
    print(json.dumps({
        "positions_per_second": {str(n): round(r, 1) for n, r in rates.items()},
        "scaling_vs_one_node": {str(n): round(r / rates[1], 2) if rates[1] else None for n, r in rates.items()},
        "promotion_to_all_nodes": distribution_latency(args.timeout),
        "cores": os.cpu_count(),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
