#!/usr/bin/env python3
"""Issue 53's acceptance as a new user would run it: their own small model, prompt file and reward.

    python scripts/bench_lm_user_model.py --arch gpt2 --seed 0 --out DIR [--minutes 10]

Builds offline (app/lm/demo_model.py) a model of a stock architecture (`--arch`: gpt2, qwen2,
llama, ... with random weights and a byte-level BPE tokenizer) and the JSONL arithmetic task
("What is a+b?"), writes the user's reward as a module of their own (`userpkg.rewards:addition`,
imported by path from `--out`), and runs ONE node on configs/lm_demo.yaml pointed at them:
`python -m app.p2p_orchestrator --config ...` for `--minutes`. Generation 1 is SFT, later ones
online GRPO from the best; the gate promotes a candidate that beats the best on the held-out
prompts (paired sign test). Prints ONE JSON object: each generation's held-out reward, the
promoted generations, the gate's verdicts and when a GRPO generation was first promoted over
the SFT model (seconds from the node's start).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.free_ports import free_ports  # noqa: E402  (after the path)
from app.lm.demo_model import DemoShape, make_demo  # noqa: E402

REWARD_MODULE = '''import re


def addition(record, completion_text):
    """1 when the last integer of the completion is the record's answer."""
    found = re.findall(r"-?\\d+", completion_text)
    return float(bool(found) and int(found[-1]) == int(record["answer"]))
'''


def user_files(out: Path, arch: str, seed: int, trainer_wait_s: float | None = None) -> Path:
    """The user's model, prompts and reward module under `out`; returns the node config's path."""
    paths = make_demo(out / "demo", DemoShape(model_type=arch, seed=seed))
    (out / "userpkg").mkdir(parents=True, exist_ok=True)
    (out / "userpkg" / "__init__.py").write_text("")
    (out / "userpkg" / "rewards.py").write_text(REWARD_MODULE)
    cfg = yaml.safe_load((ROOT / "configs" / "lm_demo.yaml").read_text())
    cfg["lm"]["model"]["path"] = str(paths["model"])
    cfg["lm"]["task"].update(path=str(paths["prompts"]), reward="userpkg.rewards:addition", seed=seed)
    cfg["lm"]["grpo"]["seed"] = seed
    if trainer_wait_s is not None:
        cfg["lm"]["grpo"]["trainer_wait_s"] = trainer_wait_s
    (out / "config.yaml").write_text(yaml.safe_dump(cfg))
    return out / "config.yaml"


def progress(port: int) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/progress", timeout=5) as answer:
            return json.loads(answer.read())
    except (OSError, ValueError):
        return None


def verdicts(log: Path) -> list[dict]:
    """The gate's decisions from the node's JSON log lines."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and row.get("event") == "generation_decided":
            out.append({"generation": row.get("generation"), "promoted": row.get("promoted"), "why": row.get("why")})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", default="gpt2", help="transformers model_type of the model built (gpt2, qwen2, llama, ...)")
    p.add_argument("--seed", type=int, default=0, help="the model's initialisation, the task's and GRPO's seed")
    p.add_argument("--out", type=Path, required=True, help="directory for the user's files and the node's data")
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--trainer-wait-s", type=float, default=None,
                   help="lm.grpo.trainer_wait_s (default: the config's; 0: a launch every generation)")
    args = p.parse_args(argv)
    config = user_files(args.out, args.arch, args.seed, args.trainer_wait_s)
    mesh, health = free_ports(2)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(args.out), os.environ.get("PYTHONPATH")]))}
    with open(args.out / "node.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "app.p2p_orchestrator", "--config", str(config),
                                 "--data-dir", str(args.out / "data"), "--port", str(mesh), "--health-port", str(health)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    start = time.monotonic()
    result: dict = {"arch": args.arch, "seed": args.seed, "minutes": args.minutes, "trainer_wait_s": args.trainer_wait_s}
    try:
        while time.monotonic() - start < args.minutes * 60 and proc.poll() is None:
            time.sleep(5)
            report = progress(mesh)
            if report is None:
                continue
            result["heldout"] = {row["generation"]: row.get("reward") for row in report.get("heldout", [])}
            result["promoted"] = [m["generation"] for m in report.get("models", []) if m.get("promoted_at") is not None]
            if "first_grpo_promoted_s" not in result and any(g >= 2 for g in result["promoted"]):
                result["first_grpo_promoted_s"] = round(time.monotonic() - start)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    result["node_exit"] = proc.returncode
    result["verdicts"] = verdicts(args.out / "node.log")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
