"""Gauntlet speed: a match's games one at a time against the same games in one lock-step wave;
prints ONE JSON object.

With no gate configured, a generation's gauntlet is 20 games of the candidate against the best
at the gauntlet's search budget. One game at a time, every network call is a batch of one
position; a wave (`app/games/train/match_games.py`, `play_games`) plays all of a worker's games in
lock step, so a call carries a leaf of every game still running. This plays the same games
(the same openings, colours and players) both ways in one process, alternated, and checks
that they end alike.

    python scripts/bench_gauntlet.py [--candidate M --best M] [--games 20] [--sims 32] [--device cpu]

Without models it makes two untrained nets of `--channels` x `--blocks` (the 2-core default,
48x4), which play the same number of network calls a move as trained ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.games.search.model import Architecture, ModelMeta, new_model, save_model  # noqa: E402
from app.games.search.players import make_player, net_spec  # noqa: E402
from app.config import load_settings  # noqa: E402
from app.games import get_game  # noqa: E402
from app.games.train.match_games import match_tasks, play_games  # noqa: E402

GAME = get_game("connect4")


def untrained(directory: Path, name: str, channels: int, blocks: int, seed: int) -> Path:
    arch = Architecture(channels, blocks, GAME.plane_shape, GAME.num_actions)
    path = directory / f"{name}.safetensors"
    save_model(new_model(arch, seed=seed), ModelMeta(arch, GAME.name), path)
    return path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--candidate", type=Path, default=None)
    p.add_argument("--best", type=Path, default=None)
    p.add_argument("--games", type=int, default=20)
    p.add_argument("--sims", type=int, default=32, help="the network players' simulations (gauntlet.net_simulations)")
    p.add_argument("--channels", type=int, default=48)
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds of both ways")
    args = p.parse_args()
    torch.set_num_threads(1)
    settings = load_settings(None)
    with tempfile.TemporaryDirectory() as tmp:
        candidate = args.candidate or untrained(Path(tmp), "candidate", args.channels, args.blocks, 1)
        best = args.best or untrained(Path(tmp), "best", args.channels, args.blocks, 2)
        specs = [net_spec(path, args.sims, settings.search.c_puct) for path in (candidate, best)]
        specs = [replace(spec, device=args.device) for spec in specs]
        tasks = match_tasks(specs[0], specs[1], args.games, settings, np.random.default_rng(0))
        players = [make_player(spec, seed=i) for i, spec in enumerate(specs)]
        seconds: dict[str, list[float]] = {"one_at_a_time": [], "wave": []}
        results: dict[str, list] = {}
        calls: dict[str, list[tuple[int, int]]] = {"one_at_a_time": [], "wave": []}
        for _ in range(args.rounds):
            for way in ("one_at_a_time", "wave"):
                for player in players:
                    player.evaluator.positions = player.evaluator.batches = 0
                started = time.perf_counter()
                if way == "wave":
                    outcomes = play_games(GAME, players[0], players[1], tasks)
                else:
                    outcomes = [o for task in tasks for o in play_games(GAME, players[0], players[1], [task])]
                seconds[way].append(time.perf_counter() - started)
                calls[way].append((sum(pl.evaluator.positions for pl in players),
                                   sum(pl.evaluator.batches for pl in players)))
                results[way] = [(o.index, o.winner) for o in outcomes]
    same = sum(a == b for a, b in zip(results["one_at_a_time"], results["wave"]))
    best_of = {way: min(s) for way, s in seconds.items()}
    positions, batches = calls["wave"][-1]
    print(json.dumps({
        "games": args.games, "simulations": args.sims, "device": args.device,
        "net": None if args.candidate else f"{args.channels}x{args.blocks} untrained",
        "seconds_one_at_a_time": [round(s, 2) for s in seconds["one_at_a_time"]],
        "seconds_wave": [round(s, 2) for s in seconds["wave"]],
        "speedup": round(best_of["one_at_a_time"] / best_of["wave"], 2),
        "positions_per_call_wave": round(positions / max(batches, 1), 1),
        "games_ending_alike": f"{same}/{len(tasks)}",
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
