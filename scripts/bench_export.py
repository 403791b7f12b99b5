"""Export speed, by stage; prints ONE JSON object.

Every generation starts with an export of the whole training window (the export daemon, before
training): on a GPU node with a window of 12,000 games it was 40 of a generation's ~100 s.
This measures, on one replay DB:

- read: the window's games out of the DB (`ReplayDB.iter_games`);
- samples: the samples of every game (`game_samples`: replay, planes, mirror images, targets);
- planes: side by side on the same states, one `state.planes()` at a time against
  `Game.stacked_planes` (the batch export uses);
- export: a whole `export_dataset` as the export daemon calls it (read, samples, the two
  NPZs written and fsynced, the manifest), and the dataset's size.

    python scripts/bench_export.py [--db games.db | --games 4000] [--window 200000]

Without --db it fills a temp DB with `--games` random legal games (random visit counts), which
export exactly as self-play games do.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from app.db.replay_db import GameRecord, MoveRecord, ReplayDB  # noqa: E402
from app.games import get_game  # noqa: E402
from app.games.train.export import export_dataset, game_samples  # noqa: E402

GAME = get_game("connect4")


def random_games(count: int, seed: int) -> list[GameRecord]:
    """`count` random legal games to the end, with random visit counts and root values."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(count):
        state, moves = GAME.initial_state(), []
        while not state.is_terminal:
            action = int(rng.choice(state.legal_moves()))
            visits = rng.integers(0, 64, GAME.num_actions).astype(np.float32)
            moves.append(MoveRecord(action, (visits / max(visits.sum(), 1.0)).tolist(), float(rng.uniform(-1, 1))))
            state = state.play(action)
        records.append(GameRecord(uid=uuid.UUID(int=int(rng.integers(2**63)) << 64 | i).hex, game=GAME.name,
                                  moves=moves, winner=state.winner, search={"simulations": 64},
                                  finished_at=float(i)))
    return records


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--db", type=Path, default=None, help="a replay DB (default: random games in a temp DB)")
    p.add_argument("--games", type=int, default=4000, help="random games when no --db is given")
    p.add_argument("--window", type=int, default=200000, help="export window (games)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_export_") as tmp:
        db_path = args.db
        if db_path is None:
            db_path = Path(tmp) / "games.db"
            with ReplayDB(db_path) as db:
                db.add_games(random_games(args.games, seed=1))

        t0 = time.perf_counter()
        with ReplayDB(db_path, create=False, readonly=True) as db:
            records = db.games(newest=args.window)
        read_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        samples = sum(len(game_samples(GAME, r, augment=True, value_mix=0.25, length_discount=0.75)) for r in records)
        samples_s = time.perf_counter() - t0

        states = []  # every position of the first 1,000 games
        for record in records[:1000]:
            state = GAME.initial_state()
            for move in record.moves:
                states.append(state)
                state = state.play(move.action)
        t0 = time.perf_counter()
        one_by_one = np.stack([s.planes() for s in states])
        per_state_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = GAME.stacked_planes(states)
        stacked_s = time.perf_counter() - t0
        if not np.array_equal(one_by_one, batched):
            print("error: stacked_planes differs from planes()", file=sys.stderr)
            return 1

        t0 = time.perf_counter()
        result = export_dataset([db_path], Path(tmp) / "dataset", window_games=args.window,
                                value_target_mix=0.25, length_discount=0.75)
        export_s = time.perf_counter() - t0
        files = result.manifest["files"]
        print(json.dumps({
            "db": str(args.db) if args.db else f"{args.games} random games", "games": len(records),
            "train_samples": result.manifest["counts"]["train_samples"], "cores": os.cpu_count(),
            "load_average": round(os.getloadavg()[0], 2),
            "read_s": round(read_s, 2), "samples_s": round(samples_s, 2), "samples_augmented": samples,
            "planes": {"states": len(states), "per_state_s": round(per_state_s, 3),
                       "stacked_s": round(stacked_s, 3), "speedup": round(per_state_s / stacked_s, 1)},
            "export_s": round(export_s, 2), "export_ms_per_game": round(1000 * export_s / len(records), 3),
            "dataset_mib": round(sum(f["bytes"] for f in files.values()) / 2**20, 1),
        }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
