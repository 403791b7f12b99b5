"""The feedback loops on vs off at equal CPU, side by side (issue 52 part B; docs/benchmarks/loops.md).

    python scripts/bench_learning.py --loops off,quality,plateau --cpu-minutes 6 --minutes 90 \\
        --config configs/bench_loops.yaml --daemons configs/bench_loops_daemons.yaml --mcts-sims 0

Each variant is one bench_learning run in its own process (its own orchestrator on its own data
dir), all started together so they share the machine's noise, each stopped when its process
tree has used `--cpu-minutes` of CPU (equal CPU, whatever each got of a shared machine).
`off` is `--config` as given; `quality` and `plateau` turn that one loop on
(feedback.<loop>.enabled), with `--loop-settings` (JSON: {"quality": {...}}) over its defaults.
Strength is the raw network's accuracy on the solver-scored Connect Four positions
(move_scores.txt), at the CPU time each model was promoted. Prints one JSON object (also
written to OUT/bench_loops.json): per variant its curve, final and best accuracy, and what its
loop decided (the pipeline state's `feedback` and its events), and each loop's difference to off.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from app.atomic_files import atomic_write_json
from app.config import ConfigError, load_settings, read_yaml_mapping

VARIANTS = ("off", "quality", "plateau")
LOOP_EVENTS = ("training_adjusted", "exploration_adjusted")


def variant_config(base: dict, name: str, loop_settings: dict) -> dict:
    """`base` with loop `name` on (off: as given, every loop off)."""
    data = json.loads(json.dumps(base))
    feedback = data.setdefault("feedback", {})
    for loop in VARIANTS[1:]:
        section = {**feedback.get(loop, {}), **loop_settings.get(loop, {})}
        section["enabled"] = loop == name
        feedback[loop] = section
    return data


def loop_decisions(data_dir: Path) -> dict:
    """What the variant's loops did: the state's last decisions and every loop event's payload."""
    state_file = data_dir / "pipeline_state.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    events = []
    journal = data_dir / "events.jsonl"
    if journal.exists():
        for line in journal.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") in LOOP_EVENTS:
                events.append({"type": entry["type"], **{k: v for k, v in entry["payload"].items() if k != "reason"}})
    return {"state": state.get("feedback", {}), "events": events}


def summarise(result: dict, data_dir: Path) -> dict:
    curve = result["curve"]
    return {
        "cpu_seconds": result["cpu_seconds"], "minutes": result["minutes"], "games": result["games"],
        "generations_promoted": result["generations_promoted"],
        "final_raw_exact": result["final"]["raw_exact"], "final_raw_outcome": result["final"]["raw_outcome"],
        "best_raw_exact": max(p["raw_exact"] for p in curve),
        "curve": [{"generation": p["generation"], "cpu_s": p["cpu_s"], "raw_exact": round(p["raw_exact"], 4)}
                  for p in curve],
        "loops": loop_decisions(data_dir),
    }


def run_variants(args: argparse.Namespace, script: Path) -> int:
    names = [n.strip() for n in args.loops.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown or not names or not args.cpu_minutes:
        print(f"error: --loops takes {', '.join(VARIANTS)} (got {unknown or names}) and needs --cpu-minutes",
              file=sys.stderr)
        return 2
    try:
        loop_settings = json.loads(args.loop_settings or "{}")
        base = read_yaml_mapping(args.config, "config") if args.config else {}
    except (ValueError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_loops_"))
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    procs = {}
    for name in names:
        config = out / f"{name}.yaml"
        config.write_text(yaml.safe_dump(variant_config(base, name, loop_settings), sort_keys=False))
        try:
            load_settings(config)  # a bad variant fails now, not after the run
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        cmd = [sys.executable, str(script), "--minutes", str(args.minutes), "--cpu-minutes", str(args.cpu_minutes),
               "--config", str(config), "--daemons", str(args.daemons), "--out", str(out / name),
               "--mcts-sims", str(args.mcts_sims), "--mcts-models", "last", "--final-games", str(args.final_games),
               "--scorers", "1"] + (["--positions", str(args.positions)] if args.positions else [])
        with open(out / f"{name}.stderr", "w") as err:
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
    codes = {name: proc.wait() for name, proc in procs.items()}
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        print(f"error: variants failed {failed} (see {out}/<variant>.stderr)", file=sys.stderr)
        return 1
    variants = {name: summarise(json.loads((out / name / "bench_learning.json").read_text()), out / name / "data")
                for name in names}
    equal_cpu = min(v["cpu_seconds"] for v in variants.values())  # a variant cut by the wall cap used less
    for v in variants.values():
        v["raw_exact_at_equal_cpu"] = [p for p in v["curve"] if p["cpu_s"] <= equal_cpu][-1]["raw_exact"]
    off = variants.get("off")
    result = {
        "cpu_minutes_each": args.cpu_minutes, "wall_cap_minutes": args.minutes, "config": str(args.config),
        "daemons": str(args.daemons), "cores": os.cpu_count(), "load_average_before": round(load_before[0], 2),
        "load_average_after": round(os.getloadavg()[0], 2), "variants": variants,
        "equal_cpu_seconds": equal_cpu,
        "vs_off": {name: {"final_raw_exact": round(v["final_raw_exact"] - off["final_raw_exact"], 4),
                          "raw_exact_at_equal_cpu": round(v["raw_exact_at_equal_cpu"] - off["raw_exact_at_equal_cpu"], 4),
                          "best_raw_exact": round(v["best_raw_exact"] - off["best_raw_exact"], 4)}
                   for name, v in variants.items() if off is not None and name != "off"},
    }
    atomic_write_json(out / "bench_loops.json", result, indent=2)
    print(json.dumps(result))
    return 0
