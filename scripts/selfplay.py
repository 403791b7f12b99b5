"""Play self-play games into a replay DB, with a progress bar and a summary at the end.

    python scripts/selfplay.py --games 200 --sims 64 --uniform --db games.db
    python scripts/selfplay.py --games 1000 --model data/models/best.safetensors --db games.db --workers 2

Exit status: 0 done, 1 a worker failed, 2 bad arguments / unusable model or DB, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--games", type=int, required=True, help="number of games to play")
    ap.add_argument("--sims", type=int, default=None, help="simulations per move (default: config search.simulations)")
    source = ap.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", type=Path, help="model .safetensors to evaluate leaves with")
    source.add_argument("--uniform", action="store_true", help="uniform prior, no network (bootstrap)")
    ap.add_argument("--db", type=Path, required=True, help="replay DB (SQLite) to add games to")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: config; 0 = in this process)")
    ap.add_argument("--concurrent", type=int, default=None, help="games per worker at once (default: config)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--config", type=Path, default=None, help="node config YAML")
    ap.add_argument("--node-id", default=None)
    ap.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if args.games < 0 or (args.sims is not None and args.sims < 1) or (args.workers is not None and args.workers < 0):
        ap.error("--games must be >= 0, --sims >= 1, --workers >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # Imported after parsing, so a usage error answers at once instead of after torch loads.
    import torch

    from app.games.search.model import ModelFormatError
    from app.config import ConfigError, load_settings
    from app.db.replay_db import ReplayDBError
    from app.log import configure_logging
    from app.games.train.selfplay import SelfplayError, run_selfplay

    torch.set_num_threads(1)
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.concurrent is not None:
        settings = settings.model_copy(
            update={"selfplay": settings.selfplay.model_copy(update={"concurrent_games": args.concurrent})}
        )
    configure_logging(args.node_id or settings.node.node_id, level="WARNING")
    sims = args.sims or settings.search.simulations
    workers = settings.selfplay.workers if args.workers is None else args.workers

    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=args.games, unit="game", file=sys.stderr, dynamic_ncols=True)

    def progress(done: int) -> None:
        if bar is not None:
            bar.update(done - bar.n)

    try:
        summary = run_selfplay(
            games=args.games, simulations=sims, db_path=args.db, model_path=args.model,
            workers=workers, seed=args.seed, node_id=args.node_id or settings.node.node_id,
            settings=settings, progress=progress,
        )
    except (ModelFormatError, ReplayDBError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except SelfplayError as exc:
        print(f"error: self-play worker failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; games finished so far are stored", file=sys.stderr)
        return 130
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print(json.dumps(summary.to_json()))
    else:
        print(
            f"{summary.games} games, {summary.positions} positions in {summary.seconds:.1f}s "
            f"({summary.games_per_second:.2f} games/s, {summary.positions_per_second:.1f} positions/s)\n"
            f"first player wins {summary.first_player_wins}, second player wins "
            f"{summary.second_player_wins}, draws {summary.draws}\n"
            f"model {summary.model_sha256 or 'uniform prior'} -> {summary.db_path}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
