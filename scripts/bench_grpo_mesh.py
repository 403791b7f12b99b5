#!/usr/bin/env python3
"""Online GRPO as the mesh runs it against the single-process loop, and over local nodes (#53).

    python scripts/bench_grpo_mesh.py [--steps 30] [--nodes 3] [--generations 2] [--timeout 900]

Three runs of configs/lm_copy.yaml's task and model (the digit Llama copying 3 digits; SFT
first, then `--steps` online GRPO steps, 8 groups of 8 a step), one after the other:

1. `single`: scripts/sft_rl.py, one process, the same SFT and GRPO settings.
2. `mesh`: one node (`python -m app.p2p_orchestrator --config ... --max-generations 2`):
   generation 1 is the SFT, generation 2 the GRPO run under torchrun, with the node's own
   self-play, export, gauntlet and mesh beside it (the shipped daemons.yaml).
3. `cluster`: `--nodes` local nodes, all voters (fast profile); the trainer's GRPO runs,
   taking the groups the other nodes' rollout workers made from its published policies first.

With `--generations G` the nodes run G generations: GRPO runs 2..G, from the third on in the
trainer that stays between generations; the figures are over all of them (the first run's
`--warmup` steps left out), with the other nodes' groups per run and who trained each generation
(`trained_by`: "n0*" where the trainer that stayed on n0 trained it on in memory).

Every run with `--max-staleness` (default 4; lm_copy.yaml's 0 would take no other node's group).

From each GRPO run's metrics (one line a step): the medians of the step's split (rollout,
reward, training, weight sync, seconds), trained tokens per second of step (sum over the steps
after `--warmup`), generated tokens per second of rollout, the groups by staleness (trainer
steps behind) summed over the steps, and the other nodes' groups. Ratios: mesh / single (the
aim is >= 0.8) and cluster / mesh. On one 2-core machine the cluster's nodes share the cores
the trainer uses: that ratio measures what rollout workers cost or give there, not a
multi-machine speed-up. Prints ONE JSON object.
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

from app.free_ports import free_ports  # noqa: E402  (after the path)
from scripts.bench_cluster import stop_cluster  # noqa: E402


def node_config(steps: int, max_staleness: int) -> dict:
    cfg = yaml.safe_load((ROOT / "configs" / "lm_copy.yaml").read_text())
    cfg["lm"]["grpo"]["steps"] = steps
    cfg["lm"]["rollout"]["max_staleness"] = max_staleness
    return cfg


def rl_lines(metrics: Path) -> list[dict]:
    out = []
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being written
        if isinstance(row, dict) and "rollout_s" in row and "trained_tokens" in row:
            out.append(row)
    return out


def summary(rows: list[dict], warmup: int = 0) -> dict:
    """The split, throughput and staleness of GRPO steps (past `warmup` steps of their run)."""
    rows = [r for r in rows if r["step"] > warmup]
    if not rows:
        return {"error": "no measured GRPO steps"}
    parts = ("rollout_s", "reward_s", "train_s", "sync_s")
    step_s = [sum(float(r[k]) for k in parts) for r in rows]
    stale: list[int] = []
    for r in rows:
        for i, n in enumerate(r.get("staleness_groups", [])):
            stale += [0] * (i + 1 - len(stale))
            stale[i] += int(n)
    return {
        "steps": len(rows),
        "median_s": {k.removesuffix("_s"): round(statistics.median(float(r[k]) for r in rows), 4) for k in parts},
        "median_step_s": round(statistics.median(step_s), 4),
        "trained_tokens_per_s": round(sum(float(r["trained_tokens"]) for r in rows) / sum(step_s), 1),
        "rollout_tokens_per_s": round(sum(float(r.get("generated_tokens", 0)) for r in rows)
                                      / max(sum(float(r["rollout_s"]) for r in rows), 1e-9), 1),
        "staleness_groups": stale,
        "remote_groups": sum(int(r.get("remote_groups", 0)) for r in rows),
        "mean_reward_last": rows[-1].get("mean_reward"),
    }


def run_single(work: Path, cfg: dict, steps: int) -> list[dict]:
    lm = cfg["lm"]
    cmd = [sys.executable, str(ROOT / "scripts" / "sft_rl.py"), "--run-dir", str(work / "single"), "--mode", "sft+rl",
           "--task", lm["task"]["name"], "--digits", str(lm["task"]["max_digits"]),
           "--sft-steps", str(lm["grpo"]["sft"]["steps"]), "--sft-lr", str(lm["grpo"]["sft"]["lr"]),
           "--rl-steps", str(steps), "--prompts-per-step", str(lm["grpo"]["groups_per_step"]),
           "--group-size", str(lm["rollout"]["n"]), "--max-staleness", str(lm["rollout"]["max_staleness"]),
           "--max-seq-len", str(lm["rollout"]["max_seq_len"]), "--temperature", str(lm["rollout"]["temperature"])]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return rl_lines(work / "single" / "metrics.jsonl")


def start_nodes(root: Path, n: int, cfg: dict, generations: int) -> list[subprocess.Popen]:
    ids = [f"n{i}" for i in range(n)]
    mesh, health = free_ports(n), free_ports(n)
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "MESH_SECRET": secrets.token_hex(16)}
    procs = []
    for i, nid in enumerate(ids):
        data = root / nid
        data.mkdir(parents=True)
        cmd = [sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
               "--data-dir", str(data), "--node-id", nid,
               "--port", str(mesh[i]), "--health-port", str(health[i]), "--max-generations", str(generations)]
        if n > 1:
            cmd += ["--profile", "fast", "--priority", str(i), "--voters", ",".join(ids),
                    "--peers", ",".join(f"{ids[j]}@127.0.0.1:{mesh[j]}" for j in range(n) if j != i)]
        log = open(data / "node.log", "wb")  # noqa: SIM115 - the child owns it
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    return procs


def run_nodes(work: Path, n: int, cfg: dict, timeout: float, generations: int) -> list[list[dict]]:
    """The GRPO steps of each run that trained generations 2..`generations` (on whichever node
    held the claim), in generation order; from generation 3 on, the trainer that stays
    (lm.grpo.trainer_wait_s) trains on in the same process."""
    root = work / f"nodes_{n}"
    procs = start_nodes(root, n, cfg, generations)
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(2)
    finally:
        stop_cluster(procs)
    runs = sorted((m.parent.name, rl_lines(m)) for m in root.glob("n*/runs/gen_*/metrics.jsonl"))
    return [rows for _, rows in runs if rows]


def trainers(root: Path) -> list[str]:
    """Who trained each generation, in order: the node, with "*" where its trainer that stayed
    trained on in memory (result.json's continued_from) rather than a fresh launch."""
    out = []
    for result in sorted(root.glob("n*/runs/gen_*/result.json"), key=lambda p: p.parent.name):
        try:
            stayed = (json.loads(result.read_text()).get("continued_from") or {}).get("in_memory")
        except (OSError, ValueError):
            continue
        out.append(result.parent.parent.parent.name + ("*" if stayed else ""))
    return out


def measured(runs: list[list[dict]], warmup: int) -> list[dict]:
    """Every run's steps but the first run's first `warmup` (a later run starts warm)."""
    return [r for i, rows in enumerate(runs) for r in rows if i or r["step"] > warmup]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="GRPO steps of each run")
    p.add_argument("--warmup", type=int, default=3, help="first steps left out of the figures")
    p.add_argument("--nodes", type=int, default=3, help="local nodes of the cluster run (0: none)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds each node run may take")
    p.add_argument("--max-staleness", type=int, default=4,
                   help="lm.rollout.max_staleness of every run (lm_copy.yaml's 0 takes no other node's group: "
                        "a worker's is at least one step behind)")
    p.add_argument("--generations", type=int, default=2,
                   help="the nodes' --max-generations: generation 1 is SFT, each later one --steps GRPO steps "
                        "(from 3 on trained on by the trainer that stays)")
    args = p.parse_args(argv)
    cfg = node_config(args.steps, args.max_staleness)
    out: dict = {"config": "configs/lm_copy.yaml", "steps": args.steps, "warmup": args.warmup,
                 "max_staleness": args.max_staleness, "generations": args.generations}
    with tempfile.TemporaryDirectory(prefix="bench_grpo_mesh_") as tmp:
        work = Path(tmp)
        out["single"] = summary(run_single(work, cfg, args.steps), args.warmup)
        for name, n in (("mesh", 1), ("cluster", args.nodes)):
            if n < 1 or name == "cluster" and n < 2:
                continue
            runs = run_nodes(work, n, cfg, args.timeout, args.generations)
            out[name] = {"nodes": n, "grpo_runs": len(runs), **summary(measured(runs, args.warmup)),
                         "remote_groups_by_run": [sum(int(r.get("remote_groups", 0)) for r in rows) for rows in runs],
                         "trained_by": trainers(work / f"nodes_{n}")}
    key = "trained_tokens_per_s"
    if key in out["single"] and key in out["mesh"]:
        out["mesh_over_single"] = round(out["mesh"][key] / out["single"][key], 3)
    if key in out.get("cluster", {}) and key in out["mesh"]:
        out["cluster_over_mesh"] = round(out["cluster"][key] / out["mesh"][key], 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
