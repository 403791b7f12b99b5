"""The per-game search kernel against an earlier revision's, side by side in one run; prints
ONE JSON object.

The earlier revision's `search_kernel.py` and `search_forest.py` (`OLD_HOME` there; the kernel
compiled against the default game alone) are read from git into a temporary package and
run beside today's forest on the same self-play loop: `--concurrent` games, `--sims`
simulations a move with root noise, the free evaluator of bench_selfplay.py (so only the
search is timed), alternating runs, best of `--runs`. Times are this thread's CPU seconds
(`time.thread_time`), so other processes on a shared machine do not inflate them.

    python scripts/bench_kernel_vs.py --rev 244f21b
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.games.search.search_forest import SearchForest  # noqa: E402
from app.games.search.search_result import choose_action, temperature_for_ply  # noqa: E402
from app.config import Settings  # noqa: E402
from app.games import get_game  # noqa: E402
from bench_selfplay import FreeEvaluator  # noqa: E402


OLD_HOME = "app/ai"  # the search's folder at --rev (before #51 moved it to app/games/search)  move: keep


def load_old_forest(rev: str, into: Path):
    package = into / "old_search"
    package.mkdir()
    (package / "__init__.py").write_text("")
    show = lambda path: subprocess.run(["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True,  # noqa: E731
                                       capture_output=True, text=True).stdout
    (package / "old_kernel.py").write_text(show(f"{OLD_HOME}/search_kernel.py"))
    # the old forest's other imports go to today's search package, wherever that lives
    (package / "old_forest.py").write_text(show(f"{OLD_HOME}/search_forest.py").replace(
        "from app.ai import search_kernel as K", "from old_search import old_kernel as K").replace(  # move: keep
        "from app.ai.", f"from {SearchForest.__module__.rpartition('.')[0]}."))  # move: keep
    sys.path.insert(0, str(into))
    from old_search.old_forest import SearchForest as Old

    return Old


def us_per_sim(cls, game, cfg, concurrent: int, sims: int, moves: int) -> float:
    forest = cls.for_search(game, cfg, trees=concurrent)
    slots = [forest.add(game.initial_state()) for _ in range(concurrent)]
    evaluator, rng = FreeEvaluator(game), np.random.default_rng(2)
    forest.search(slots, evaluator, 1, cfg, rng)  # roots expanded and kernel loaded outside the timing
    plies, played = [0] * concurrent, 0
    start = time.thread_time()
    for _ in range(moves):
        for i, result in enumerate(forest.search(slots, evaluator, sims, cfg, rng, add_noise=True)):
            action = choose_action(result.visits, temperature_for_ply(plies[i], cfg.temperature_moves), rng)
            forest.advance(slots[i], action)
            plies[i], played = plies[i] + 1, played + 1
            if forest.root_state(slots[i]).is_terminal:
                forest.reset(slots[i], game.initial_state())
                plies[i] = 0
    return (time.thread_time() - start) / (played * sims) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="244f21b", help="the revision whose kernel is the baseline")
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--sims", type=int, default=64)
    ap.add_argument("--moves", type=int, default=18)
    ap.add_argument("--runs", type=int, default=4)
    args = ap.parse_args()
    torch.set_num_threads(1)
    settings = Settings()
    game = get_game(settings.node.game)
    plain = settings.search.model_copy(update={"threat_check": False})
    out: dict = {"rev": args.rev, "game": game.name, "concurrent_games": args.concurrent, "simulations": args.sims,
                 "load_average": [round(x, 1) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as tmp:
        old = load_old_forest(args.rev, Path(tmp))
        for name, cfg in (("threat_check", settings.search), ("no_threat_check", plain)):
            runs: dict = {"baseline": [], "today": []}
            for _ in range(args.runs):
                runs["baseline"].append(us_per_sim(old, game, cfg, args.concurrent, args.sims, args.moves))
                runs["today"].append(us_per_sim(SearchForest, game, cfg, args.concurrent, args.sims, args.moves))
            best = {k: min(v) for k, v in runs.items()}
            out[name] = {"baseline_cpu_us_per_sim": round(best["baseline"], 2),
                         "today_cpu_us_per_sim": round(best["today"], 2),
                         "today_over_baseline": round(best["today"] / best["baseline"], 3)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
