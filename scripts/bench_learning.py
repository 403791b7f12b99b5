#!/usr/bin/env python
"""How fast the single-node loop learns: accuracy on solver-scored positions per wall and CPU second.

    python scripts/bench_learning.py --minutes 120 [--config F] [--out DIR] [--mcts-sims 400]
                                     [--mcts-models all|last] [--final-games 40]

Runs the real orchestrator on a fresh data dir (by default exactly as `make run` does: no
node config, the repository's daemons.yaml) for `--minutes`, sampling the CPU seconds of its
whole process tree (self-play workers, torchrun ranks, the gauntlet) every 2 s. When the
budget is spent it stops the loop and scores the untrained starting network and every
promoted generation on ../shared/benchmarks/connect4/move_scores.txt with the raw network
and, unless `--mcts-sims 0`, with MCTS. The scoring runs after the loop so it never takes a
core from it; each point is placed at the wall and CPU time its model was promoted.

Prints one JSON object (also written to DIR/bench_learning.json) and draws DIR/learning_curve.png
(exact-move and outcome accuracy against wall-clock and CPU minutes) when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.games.search.model import Architecture, load_model, new_model  # noqa: E402
from app.atomic_files import atomic_write_json  # noqa: E402
from app.config import load_settings  # noqa: E402
from app.db.registry import ModelRegistry, ModelStatus  # noqa: E402
from app.games import get_game  # noqa: E402
from app.shared.process_group import DEVICE_CHOICES, network_device  # noqa: E402
from app.games.train.solved_eval import (  # noqa: E402
    SolvedEvalError, default_positions_path, load_positions, random_mover_accuracy, score_model,
)
from bench_loop import final_scores, game_counts, pipeline_history, run_loop, stage_shares  # noqa: E402

# The acceptance lines, drawn on the plot for orientation.
TARGETS = {"raw exact": 0.80, "raw outcome": 0.93, "mcts exact": 0.92}


def tree_cpu_seconds(root_pid: int, proc_dir: Path = Path("/proc")) -> float:
    """CPU seconds (user + system) of a live process tree, including the children each member
    has already reaped (cutime/cstime), so finished self-play workers and training runs count."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        fields = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ...
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15]) / tick  # utime stime cutime cstime
    members, frontier = {root_pid}, [root_pid]
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    while frontier:
        for child in children.get(frontier.pop(), []):
            if child not in members:
                members.add(child)
                frontier.append(child)
    return sum(times.get(pid, 0.0) for pid in members)


class CpuSampler:
    """(wall time, CPU seconds of the loop's tree) pairs, never decreasing in CPU: a member
    that exits before its parent reaps it drops out for a moment, and that dip is not real."""

    def __init__(self, cpu_budget_s: float | None = None) -> None:
        self.samples: list[tuple[float, float]] = []
        self.cpu_budget_s = cpu_budget_s  # True once the tree has used this much: run_loop stops it

    def __call__(self, pid: int) -> bool:
        cpu = tree_cpu_seconds(pid)
        if self.samples:
            cpu = max(cpu, self.samples[-1][1])
        self.samples.append((time.time(), cpu))
        return self.cpu_budget_s is not None and cpu >= self.cpu_budget_s

    def at(self, t: float) -> float:
        if not self.samples:
            return 0.0
        walls, cpus = zip(*self.samples)
        return float(np.interp(t, walls, cpus))


def promoted_models(data_dir: Path) -> tuple[list, int, int]:
    """(models promoted at some point, oldest first; promoted count; rejected count)."""
    if not (data_dir / "registry.db").exists():
        return [], 0, 0
    with ModelRegistry(data_dir / "registry.db") as registry:
        models = registry.models()
    promoted = sorted((m for m in models if m.promoted_at is not None), key=lambda m: m.promoted_at)
    return (promoted, sum(m.status is ModelStatus.PROMOTED for m in models),
            sum(m.status is ModelStatus.REJECTED for m in models))


def curve_point(report: dict, mcts_sims: int) -> dict:
    point = {"raw_exact": report["raw"]["exact"], "raw_outcome": report["raw"]["outcome"],
             "raw_middle_exact": report["raw"]["by_phase"].get("middle", {}).get("exact"),
             "raw_won_exact": report["raw"]["by_result"].get("won", {}).get("exact"),
             "raw_lost_exact": report["raw"]["by_result"].get("lost", {}).get("exact"),
             "value_exact": report["value"]["exact"], "value_outcome": report["value"]["outcome"]}
    if mcts_sims and str(mcts_sims) in report.get("mcts", {}):  # not scored with MCTS: raw only
        mcts = report["mcts"][str(mcts_sims)]
        point.update(mcts_exact=mcts["exact"], mcts_outcome=mcts["outcome"], mcts_seconds=mcts["seconds"],
                     mcts_opening_exact=mcts["by_phase"].get("opening", {}).get("exact"), mcts_misses=mcts["misses"])
    return point


def plot_curves(curve: list[dict], path: Path, title: str, mcts_sims: int = 0) -> bool:
    """Accuracy against wall and CPU minutes, two panels; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    series = [("raw_exact", "raw net, exact", "C0", "-"), ("raw_outcome", "raw net, outcome", "C0", "--"),
              ("value_exact", "value head one ply deep, exact", "C2", ":"),
              ("mcts_exact", f"MCTS {mcts_sims}, exact", "C1", "-"), ("mcts_outcome", f"MCTS {mcts_sims}, outcome", "C1", "--")]
    for ax, x_key, label in ((axes[0], "wall_s", "wall-clock minutes"), (axes[1], "cpu_s", "CPU minutes (whole loop)")):
        for key, name, colour, style in series:
            pts = [(p[x_key] / 60, p[key]) for p in curve if p.get(key) is not None]
            if pts:
                xs, ys = zip(*pts)
                ax.plot(xs, ys, style, color=colour, marker="o", label=name)
        right = max([p[x_key] / 60 for p in curve] + [1.0]) * 1.05
        for (name, level), va in zip(TARGETS.items(), ("top", "bottom", "top")):
            ax.axhline(level, color="grey", linewidth=0.6, linestyle=":")
            ax.text(right, level, f"aim {name} {level:.2f} ", fontsize=7, va=va, ha="right", color="grey")
        ax.set_xlim(0, right)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of positions (move_scores.txt)")
    axes[0].set_ylim(0, 1)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    os.replace(tmp, path)
    return True


def score_one(job: tuple[str | None, str | None], config: Path | None, positions: list, budgets: list[int],
              device: str = "cpu") -> dict:
    """One model's report: the file at `path` (checked against its sha256), or the untrained
    start when the path is None, its network on `device` (a GPU node scores a large net there).
    Module level so a scoring process can run it."""
    torch.set_num_threads(1)
    path, sha256 = job
    settings = load_settings(config)
    if path is None:
        game = get_game(settings.node.game)
        arch = Architecture(settings.model.channels, settings.model.blocks, game.plane_shape, game.num_actions)
        net = new_model(arch, seed=settings.train.seed)
    else:
        net, _ = load_model(path, expect_sha256=sha256)
    report = score_model(net.to(network_device(device)), positions, budgets, settings.search)
    exact = {budget: result["exact"] for budget, result in report.get("mcts", {}).items()}
    print(json.dumps({"scored": path or "untrained", "raw_exact": report["raw"]["exact"], "mcts_exact": exact}),
          file=sys.stderr, flush=True)
    return report


def score_all(jobs: list, config: Path | None, positions: list, budgets: list[list[int]], scorers: int,
              device: str = "cpu") -> list[dict]:
    """Every model's report (each with its own budgets), in order, on `scorers` processes: the
    loop has stopped by now, so the scoring may use every core (MCTS-400 over 931 positions is minutes per model)."""
    if scorers <= 1 or len(jobs) <= 1:
        return [score_one(job, config, positions, b, device) for job, b in zip(jobs, budgets)]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(min(scorers, len(jobs)), mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(score_one, jobs, [config] * len(jobs), [positions] * len(jobs), budgets,
                             [device] * len(jobs)))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, required=True)
    p.add_argument("--config", type=Path, default=None, help="node config YAML (default: none, as `make run`)")
    p.add_argument("--daemons", type=Path, default=ROOT / "daemons.yaml", help="daemons file (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="where the JSON and the plot go (default: a new temp dir)")
    p.add_argument("--data-dir", type=Path, default=None, help="the loop's data dir (default: <out>/data)")
    p.add_argument("--mcts-sims", type=int, default=400, help="MCTS budget of the search score; 0 skips it")
    p.add_argument("--positions", type=Path, default=None, help="move_scores.txt (default: the shared benchmark)")
    p.add_argument("--mcts-models", choices=("all", "last"), default="all",
                   help="score every promoted model with MCTS, or only the last (default: %(default)s)")
    p.add_argument("--final-games", type=int, default=40,
                   help="games of the last model vs random and the heuristic at the gauntlet's budget; 0 skips")
    p.add_argument("--scorers", type=int, default=os.cpu_count() or 1,
                   help="processes that score the models after the loop (default: one per core)")
    p.add_argument("--score-device", choices=DEVICE_CHOICES, default="cpu",
                   help="where the scoring networks run (default: %(default)s; cuda on a GPU node)")
    p.add_argument("--cpu-minutes", type=float, default=None,
                   help="stop the loop once its process tree has used this much CPU (--minutes stays the wall cap)")
    p.add_argument("--loops", default=None,
                   help="comma-separated variants run side by side at equal CPU (needs --cpu-minutes): off and "
                        "feedback loops (quality, plateau), each on alone over --config (scripts/bench_feedback.py)")
    p.add_argument("--loop-settings", default=None, help='with --loops: JSON over each loop\'s settings, e.g. {"quality": {"low": 0.8}}')
    p.add_argument("--configs", default=None,
                   help="comma-separated variants of a --config with several configs (needs --cpu-minutes): loops "
                        "(the scheduler as configured), fixed (equal shares) (scripts/bench_configs.py)")
    p.add_argument("--side-by-side", action="store_true", help="with --configs: run the variants together")
    args = p.parse_args(argv)
    if args.configs:
        from bench_configs import run_configs
        return run_configs(args, ROOT / "scripts" / "bench_learning.py")
    if args.loops:
        from bench_feedback import run_variants
        return run_variants(args, ROOT / "scripts" / "bench_learning.py")
    if args.minutes <= 0 or args.mcts_sims < 0 or args.scorers < 1 or args.final_games < 0:
        p.error("--minutes must be > 0, --mcts-sims >= 0, --scorers >= 1 and --final-games >= 0")
    torch.set_num_threads(1)
    try:  # fail before a long run, not after it
        positions = load_positions(args.positions or default_positions_path(ROOT))
        settings = load_settings(args.config)  # a bad config fails now, not after the run
    except (SolvedEvalError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_learning_"))
    out.mkdir(parents=True, exist_ok=True)
    data_dir = args.data_dir or out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)

    load_before = os.getloadavg()
    sampler = CpuSampler(args.cpu_minutes * 60 if args.cpu_minutes else None)
    started, ended = run_loop(args.config, args.daemons, data_dir, args.minutes, on_tick=sampler)
    load_after = os.getloadavg()
    children = os.times()
    cpu_total = children.children_user + children.children_system  # the reaped orchestrator's whole tree

    budgets = [0] + ([args.mcts_sims] if args.mcts_sims else [])
    promoted, n_promoted, n_rejected = promoted_models(data_dir)
    # generation 0 is the untrained net generation 1 starts training from
    jobs = [(None, None)] + [(str(m.path), m.sha256) for m in promoted]
    # MCTS for every model, or (a shorter session) for the last only: minutes of CPU a model
    job_budgets = [budgets if args.mcts_models == "all" or i == len(jobs) - 1 else [0] for i in range(len(jobs))]
    reports = score_all(jobs, args.config, positions, job_budgets, args.scorers, args.score_device)
    curve = [{"generation": 0, "wall_s": 0.0, "cpu_s": 0.0, **curve_point(reports[0], args.mcts_sims)}]
    for model, report in zip(promoted, reports[1:]):
        curve.append({"generation": model.generation, "wall_s": round(model.promoted_at - started, 1),
                      "cpu_s": round(sampler.at(model.promoted_at), 1), **curve_point(report, args.mcts_sims)})

    final_match = None
    if args.final_games and promoted:  # the acceptance line: >= 0.6 vs the heuristic at the gauntlet's budget
        final_match = {"generation": promoted[-1].generation, "games": args.final_games,
                       "simulations": settings.gauntlet.net_simulations,
                       **final_scores(promoted[-1].path, settings, settings.gauntlet.net_simulations,
                                      args.final_games, data_dir)}
        print(json.dumps({"final_match": final_match}), file=sys.stderr, flush=True)

    games, positions_played = game_counts(data_dir)
    wall = ended - started
    plot = out / "learning_curve.png"
    title = (f"bench_learning: {args.config or 'make run defaults'}, {wall / 60:.1f} min, "
             f"load {load_before[0]:.1f}->{load_after[0]:.1f} on {os.cpu_count()} cores")
    drawn = plot_curves(curve, plot, title, args.mcts_sims)
    result = {
        "minutes": round(wall / 60, 2), "cpu_minutes_budget": args.cpu_minutes, "config": str(args.config) if args.config else None,
        "daemons": str(args.daemons), "data_dir": str(data_dir), "cores": os.cpu_count(),
        "load_average_before": round(load_before[0], 2), "load_average_after": round(load_after[0], 2),
        "cpu_seconds": round(max(cpu_total, sampler.samples[-1][1] if sampler.samples else 0.0), 1),
        "games": games, "positions_per_second": round(positions_played / wall, 1) if wall > 0 else 0.0,
        "generations_promoted": n_promoted, "generations_rejected": n_rejected,
        "stage_share": stage_shares(pipeline_history(data_dir), started, ended),
        "positions": len(positions), "random_mover": random_mover_accuracy(positions),
        "mcts_simulations": args.mcts_sims or None, "curve": curve,
        "final": curve[-1], "final_match": final_match, "plot": str(plot) if drawn else None,
    }
    atomic_write_json(out / "bench_learning.json", result, indent=2)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
