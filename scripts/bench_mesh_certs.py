#!/usr/bin/env python
"""What quorum certificates cost, and whether leadership holds under load (issue 54); prints
ONE JSON object. Also run from `scripts/bench_mesh.py` (`--cert-rounds`, `--churn`).

* cpu: three mesh nodes in one process (the `lan` profile, shared secret or per-node keys),
  once settled: the process's CPU per gossip round while idle (gossip and heartbeats, per node
  and round), and per decision (`commit` of a generation record through the quorum, the idle
  rate over the same wall time taken off). Side by side in one run: this tree (certificates)
  and a git revision before them (`--baseline`, default 244f21b: today's signed messages),
  extracted with `git archive` and run with its own code, rounds interleaved.
* churn: three full orchestrator nodes (self-play, export, train, gauntlet, promote,
  distribution) on this machine, `--churn-seconds` each for the profiles in `--churn`; leader
  changes counted from every node's `mesh_history.jsonl` (`became_leader`) after the first
  leader, and per hour.

    python scripts/bench_mesh_certs.py --cert-rounds 3 --churn fast,lan --churn-seconds 300
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.log import epoch_of  # noqa: E402
from scripts.bench_cluster import FULL, stop_cluster  # noqa: E402 - needs ROOT on the path

PROBE = r'''
import asyncio, json, sys, tempfile, time
from pathlib import Path
from app.config import Settings
from app.config.mesh import MeshConfig, TlsConfig
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.tls import init_ca
from app.free_ports import free_ports
from app.log import configure_logging
configure_logging("bench", "ERROR", json=True)
mode, decisions, idle_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

async def main():
    with tempfile.TemporaryDirectory() as tmp:
        ids, ports = ["n0", "n1", "n2"], free_ports(3)
        certs = Path(tmp) / "certs"
        if mode == "node_keys":
            init_ca(certs, ids)
        def settings(nid):
            if mode != "node_keys":
                return Settings()
            files = TlsConfig(ca_file=certs / "ca.pem", cert_file=certs / f"{nid}.pem", key_file=certs / f"{nid}.key")
            return Settings().model_copy(update={"mesh": MeshConfig(node_keys=files)})
        nodes = [MeshNode(settings(ids[i]), node_id=ids[i], host="127.0.0.1", port=ports[i], data_dir=Path(tmp) / ids[i],
                          peers=[f"{ids[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i], voters=ids,
                          priority=i, profile="lan", secret=b"bench-mesh-secret") for i in range(3)]
        for n in nodes:
            await n.start()
        end, leads = time.monotonic() + 60, []
        while time.monotonic() < end:
            leads = [n for n in nodes if n.is_leader]
            if len(leads) == 1 and all(n.leader_id == leads[0].node_id for n in nodes):
                break
            await asyncio.sleep(0.05)
        leader = leads[0]
        await asyncio.sleep(2.0)
        c0, t0 = time.process_time(), time.monotonic()
        await asyncio.sleep(idle_s)
        idle_cpu, idle_wall = time.process_time() - c0, time.monotonic() - t0
        rounds = 3 * idle_wall / nodes[0].timing.gossip_interval
        c0, t0, ok = time.process_time(), time.monotonic(), 0
        for k in range(decisions):
            value = json.dumps({"generation": k + 1, "sha256": f"{k:064x}", "promoted": True, "parent": None})
            ok += bool(await leader.commit(f"generation/{k + 1}", value))
        await asyncio.sleep(0.3)  # the learn step's messages, answered
        dec_cpu, dec_wall = time.process_time() - c0, time.monotonic() - t0
        per_s = idle_cpu / idle_wall
        print(json.dumps({"gossip_round_cpu_ms": 1000 * idle_cpu / rounds, "idle_cpu_per_s": per_s,
                          "decision_cpu_ms": 1000 * max(0.0, dec_cpu - per_s * dec_wall) / max(ok, 1),
                          "decision_wall_ms": 1000 * (dec_wall - 0.3) / max(ok, 1), "decided": ok,
                          "leader_term": leader.term}))
        for n in nodes:
            await n.stop()

asyncio.run(main())
'''


def baseline_tree(rev: str, into: Path) -> Path:
    """`rev` of this repository, extracted (git archive) into `into`."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def probe(tree: Path, mode: str, decisions: int, idle_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE, mode, str(decisions), str(idle_s)], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"probe in {tree} ({mode}) failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_certificates(rounds: int, decisions: int, idle_s: float, baseline: str) -> dict:
    out: dict = {"baseline_rev": baseline, "rounds": rounds, "decisions_per_round": decisions, "idle_s": idle_s}
    with tempfile.TemporaryDirectory(prefix="mesh-certs-") as tmp:
        trees = {"certificates": ROOT, "before": baseline_tree(baseline, Path(tmp) / "before")}
        runs: dict[str, list[dict]] = {}
        for r in range(rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for mode in ("shared", "node_keys"):
                for name in order:
                    print(f"certificates: round {r + 1}, {name}, {mode} ...", file=sys.stderr, flush=True)
                    runs.setdefault(f"{name}/{mode}", []).append(probe(trees[name], mode, decisions, idle_s))
    out["median"] = {k: {m: round(statistics.median(x[m] for x in v), 3)
                         for m in ("gossip_round_cpu_ms", "idle_cpu_per_s", "decision_cpu_ms", "decision_wall_ms")}
                     for k, v in runs.items()}
    out["runs"] = runs
    return out


CONFIG = {
    "model": {"channels": 16, "blocks": 1}, "search": {"simulations": 16},
    "selfplay": {"concurrent_games": 32, "collect_workers": 1}, "train": {"batch_size": 128, "epochs": 2},
    "gauntlet": {"games_vs_baseline": 8, "max_games_vs_best": 16, "net_simulations": 8},
    "promotion": {"min_score_vs_random": 0.5, "min_score_vs_heuristic": None},
}


def _history(data: Path) -> list[dict]:
    path = data / "mesh_history.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def bench_churn(profile: str, seconds: float) -> dict:
    """Three full nodes for `seconds` after the first leader: leader changes, terms, per hour."""
    from app.free_ports import free_ports

    ids = [f"n{i}" for i in range(3)]
    with tempfile.TemporaryDirectory(prefix=f"mesh-churn-{profile}-") as tmp:
        root = Path(tmp)
        mesh, health = free_ports(3), free_ports(3)
        (root / "daemons.yaml").write_text(yaml.safe_dump(FULL))
        (root / "config.yaml").write_text(yaml.safe_dump(CONFIG))
        env = {**os.environ, "MESH_SECRET": secrets.token_hex(16), "PYTHONPATH": str(ROOT)}
        procs, dirs = [], []
        for i, nid in enumerate(ids):
            data = root / nid
            data.mkdir(parents=True)
            peers = ",".join(f"{ids[j]}@127.0.0.1:{mesh[j]}" for j in range(3) if j != i)
            cmd = [sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
                   "--daemons", str(root / "daemons.yaml"), "--data-dir", str(data), "--node-id", nid,
                   "--port", str(mesh[i]), "--health-port", str(health[i]), "--profile", profile,
                   "--priority", str(i), "--voters", ",".join(ids), "--peers", peers]
            log = open(data / "node.log", "wb")  # noqa: SIM115 - the child owns it
            procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            dirs.append(data)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and not any(
                    e["event"] == "became_leader" for d in dirs for e in _history(d)):
                time.sleep(0.5)
            t0 = time.time()
            load0 = os.getloadavg()[0]
            loads = _sample_load(seconds)  # (seconds since t0, 1-minute load average)
            load1 = os.getloadavg()[0]
            events = sorted((e for d in dirs for e in _history(d)), key=epoch_of)
        finally:
            stop_cluster(procs)
    elected = [e for e in events if e["event"] == "became_leader"]
    first = elected[0] if elected else None
    changes = [e for e in elected[1:] if epoch_of(e) <= t0 + seconds]
    stepped = [e.get("reason", "") for e in events if e["event"] == "stepped_down" and epoch_of(e) <= t0 + seconds]
    return {"profile": profile, "seconds": seconds, "first_leader": first and first["node"],
            "leader_changes": len(changes), "per_hour": round(len(changes) * 3600 / seconds, 1),
            "terms": [first["term"] if first else None, max((e["term"] for e in events), default=None)],
            "step_down_reasons": stepped[:20], "load_avg_1m": [round(load0, 2), round(load1, 2)],
            "load_avg_1m_over_run": {"min": round(min(x for _, x in loads), 2),
                                     "mean": round(statistics.fmean(x for _, x in loads), 2),
                                     "max": round(max(x for _, x in loads), 2), "samples": len(loads)},
            # each change: seconds after the first leader, the new leader, its term, and the load then
            "changes": [{"t_s": round(epoch_of(e) - t0, 1), "node": e["node"], "term": e["term"],
                         "load_1m": _load_at(loads, epoch_of(e) - t0)} for e in changes]}


def _sample_load(seconds: float, every_s: float = 30.0) -> list[tuple[float, float]]:
    """Sleep `seconds`, reading the 1-minute load average every `every_s`: the machine is
    shared, and a churn figure means little without the load it was taken under."""
    start = time.monotonic()
    end = start + seconds
    loads = [(0.0, os.getloadavg()[0])]
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(every_s, left))
        loads.append((time.monotonic() - start, os.getloadavg()[0]))
    return loads


def _load_at(loads: list[tuple[float, float]], t: float) -> float:
    """The load sample nearest after `t` (the 1-minute average covers the minute before it)."""
    return round(next((x for at, x in loads if at >= t), loads[-1][1]), 2)


def _partial(what: str, result: dict) -> None:
    """Each part's result on stderr as soon as it is measured: a run of an hour must not lose
    its first half to a failure in its second."""
    print(f"{what}: {json.dumps(result)}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cert-rounds", type=int, default=3, help="interleaved rounds per tree and key mode (0: skip)")
    p.add_argument("--decisions", type=int, default=30)
    p.add_argument("--idle-s", type=float, default=6.0)
    p.add_argument("--baseline", default="244f21b", help="the revision before certificates")
    p.add_argument("--churn", default="fast", help="profiles, comma separated ('': skip)")
    p.add_argument("--churn-seconds", type=float, default=300.0)
    args = p.parse_args(argv)
    out: dict = {"bench": "mesh_certs", "host_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    if args.cert_rounds:
        out["certificates"] = bench_certificates(args.cert_rounds, args.decisions, args.idle_s, args.baseline)
        _partial("certificates", out["certificates"])
    out["churn"] = []
    for profile in filter(None, args.churn.split(",")):
        out["churn"].append(bench_churn(profile, args.churn_seconds))
        _partial(f"churn {profile}", out["churn"][-1])
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
