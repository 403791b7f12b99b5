"""What the fixed anchor's games cost a generation: the default gauntlet with them and without,
alternated in one process; prints ONE JSON object.

A generation's gauntlet with the default settings (no promotion gate) plays the candidate
against the current best (SPRT, up to `max_games_vs_best`) and, by default, a few games against
the fixed anchor (`gauntlet.anchor`, `games_vs_anchor`: app/games/train/gauntlet_baselines.py).
This plays that gauntlet as a lone node does (`run_gauntlet`, one inline worker, one torch
thread, a fresh registry each time) with the anchor off and on, alternated round by round so
the shared machine's load falls on both alike, and reports wall and CPU seconds of each.

    python scripts/bench_anchor.py [--candidate M --best M] [--rounds 3] [--games-vs-anchor 4]

Without models it makes two untrained nets of `--channels` x `--blocks` (the 2-core default,
48x4), which make as many network calls a move as trained ones (their games may be longer).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from app.config import load_settings  # noqa: E402
from app.games.train.gauntlet import run_gauntlet  # noqa: E402
from app.games.train.gauntlet_baselines import planned_baselines  # noqa: E402
from scripts.bench_gauntlet import untrained  # noqa: E402


def play(candidate: Path, best: Path, anchor_games: int, registry: Path, seed: int) -> dict:
    settings = load_settings(None, gauntlet={"games_vs_anchor": anchor_games, "workers": 1})
    wall, cpu = time.perf_counter(), time.process_time()
    report = run_gauntlet(candidate, planned_baselines([], settings), best, settings, registry, workers=1, seed=seed)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_s": wall, "cpu_s": cpu, "games": {r.kind: r.games for r in report.results},
            "anchor_score": next((r.score for r in report.results if r.kind == "anchor"), None)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidate", type=Path, default=None)
    p.add_argument("--best", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--games-vs-anchor", type=int, default=load_settings(None).gauntlet.games_vs_anchor)
    p.add_argument("--channels", type=int, default=48)
    p.add_argument("--blocks", type=int, default=4)
    args = p.parse_args()
    torch.set_num_threads(1)
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        candidate = args.candidate or untrained(Path(tmp), "candidate", args.channels, args.blocks, 1)
        best = args.best or untrained(Path(tmp), "best", args.channels, args.blocks, 2)
        play(candidate, best, 0, Path(tmp) / "warm.db", 99)  # the search kernel loaded before timing
        for r in range(args.rounds):
            for way, games in (("off", 0), ("on", args.games_vs_anchor)):
                runs[way].append(play(candidate, best, games, Path(tmp) / f"{way}{r}.db", seed=r))
    median = {way: {k: statistics.median(x[k] for x in rs) for k in ("wall_s", "cpu_s")} for way, rs in runs.items()}
    print(json.dumps({
        "net": None if args.candidate else f"{args.channels}x{args.blocks} untrained",
        "games_vs_anchor": args.games_vs_anchor, "rounds": args.rounds, "load_1min": round(os.getloadavg()[0], 1),
        "games": {way: rs[0]["games"] for way, rs in runs.items()},
        "wall_s": {way: [round(x["wall_s"], 2) for x in rs] for way, rs in runs.items()},
        "cpu_s": {way: [round(x["cpu_s"], 2) for x in rs] for way, rs in runs.items()},
        "anchor_scores": [x["anchor_score"] for x in runs["on"]],
        "extra_wall_s_median": round(median["on"]["wall_s"] - median["off"]["wall_s"], 2),
        "extra_cpu_s_median": round(median["on"]["cpu_s"] - median["off"]["cpu_s"], 2),
        "cpu_ratio_median": round(median["on"]["cpu_s"] / median["off"]["cpu_s"], 3),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
