"""Three configs on one node: the scheduler's loops on vs fixed equal shares, at equal CPU
(issue 52 item 4; docs/benchmarks/configs.md).

    python scripts/bench_learning.py --configs loops,fixed --cpu-minutes 4 --minutes 5 \\
        --config configs/bench_configs.yaml --daemons configs/bench_loops_daemons.yaml --mcts-sims 0

Each variant is one bench_learning run (its own orchestrator with every config of `--config`,
its own data dir), stopped when its process tree used `--cpu-minutes` of CPU. `loops` runs the
scheduler as configured (Elo -> self-play, regression -> curriculum, promotion -> rebalance);
`fixed` turns its three loops off (`progress: false`, no staleness, no boost, no rebalance on a
promotion): equal shares by weight. The variants run one after the other by default (a 2-core
machine shared with others takes one heavy process group at a time); `--side-by-side` starts
them together so they share the machine's noise. Strength per config: the first config's raw
network on the solved Connect Four positions (bench_learning's curve), every config's best
model's Elo against the fixed anchor (its registry's fit) and the core-seconds the scheduler
gave it. Prints one JSON object (also OUT/bench_configs.json).
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
from app.config.configs import lineage_settings
from app.db.registry import ModelRegistry
from app.games.train.gauntlet_baselines import anchor_player
from app.games.train.promotion import progress_report

VARIANTS = {"loops": {}, "fixed": {"progress": False, "staleness_weight": 0.0, "regression_boost": 1.0,
                                   "rebalance_on_promotion": False}}


def variant_config(base: dict, name: str) -> dict:
    """`base` with the scheduler of variant `name` over its own `scheduler:` settings."""
    data = json.loads(json.dumps(base))
    data["scheduler"] = {**data.get("scheduler", {}), **VARIANTS[name]}
    return data


def config_strength(config: Path, data_dir: Path) -> dict:
    """Per config: promoted generations and the best model's Elo vs the fixed anchor (its own
    registry's fit over every gauntlet game), and the core-seconds the node gave it."""
    settings = load_settings(config).model_copy(update={"node": load_settings(config).node.model_copy(
        update={"data_dir": data_dir})})
    saved = data_dir / "config_scheduler.json"
    cpu = json.loads(saved.read_text()).get("cpu_s", {}) if saved.exists() else {}
    out = {}
    for entry, lineage in lineage_settings(settings):
        registry_db = Path(lineage.node.data_dir) / "registry.db"
        report = {"models": []}
        if registry_db.exists():
            with ModelRegistry(registry_db) as registry:
                report = progress_report(registry, anchor_player(lineage))
        promoted = [m for m in report["models"] if m["promoted_at"] is not None]
        best = next((m for m in report["models"] if m["current"]), None)
        out[entry.name] = {"game": entry.label, "generations_promoted": len(promoted),
                           "best_generation": best["generation"] if best else 0,
                           "best_elo_vs_anchor": None if best is None or best["elo"] is None else round(best["elo"], 1),
                           "anchor": anchor_player(lineage), "cpu_seconds": round(float(cpu.get(entry.name, 0.0)), 1),
                           "elo_by_generation": [[m["generation"], None if m["elo"] is None else round(m["elo"], 1)]
                                                 for m in promoted]}
    return out


def run_configs(args: argparse.Namespace, script: Path) -> int:
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown or not names or not args.cpu_minutes or args.config is None:
        print(f"error: --configs takes {', '.join(VARIANTS)} (got {unknown or names}), needs --cpu-minutes and "
              "a --config with configs:", file=sys.stderr)
        return 2
    try:
        base = read_yaml_mapping(args.config, "config")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_configs_"))
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    configs, procs, codes = {}, {}, {}
    for name in names:
        configs[name] = out / f"{name}.yaml"
        configs[name].write_text(yaml.safe_dump(variant_config(base, name), sort_keys=False))
        try:
            load_settings(configs[name])  # a bad variant fails now, not after the run
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    for name in names:
        cmd = [sys.executable, str(script), "--minutes", str(args.minutes), "--cpu-minutes", str(args.cpu_minutes),
               "--config", str(configs[name]), "--daemons", str(args.daemons), "--out", str(out / name),
               "--mcts-sims", str(args.mcts_sims), "--mcts-models", "last", "--final-games", "0", "--scorers", "1"]
        with open(out / f"{name}.stderr", "w") as err:
            procs[name] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err)
        if not args.side_by_side:
            codes[name] = procs[name].wait()
    codes.update({name: proc.wait() for name, proc in procs.items() if name not in codes})
    failed = {name: code for name, code in codes.items() if code != 0}
    if failed:
        print(f"error: variants failed {failed} (see {out}/<variant>.stderr)", file=sys.stderr)
        return 1
    variants = {}
    for name in names:
        learning = json.loads((out / name / "bench_learning.json").read_text())
        variants[name] = {"cpu_seconds": learning["cpu_seconds"], "minutes": learning["minutes"],
                          "games_first_config": learning["games"],
                          "first_config_raw_exact": [[p["generation"], p["cpu_s"], round(p["raw_exact"], 4)]
                                                     for p in learning["curve"]],
                          "configs": config_strength(configs[name], out / name / "data")}
    result = {"cpu_minutes_each": args.cpu_minutes, "wall_cap_minutes": args.minutes, "config": str(args.config),
              "daemons": str(args.daemons), "side_by_side": args.side_by_side, "cores": os.cpu_count(),
              "load_average_before": round(load_before[0], 2), "load_average_after": round(os.getloadavg()[0], 2),
              "variants": variants}
    atomic_write_json(out / "bench_configs.json", result, indent=2)
    print(json.dumps(result))
    return 0
