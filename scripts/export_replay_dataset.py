#!/usr/bin/env python3
"""Export replay DBs to an NPZ training dataset (thin CLI over app.games.train.export).

    python scripts/export_replay_dataset.py --db data/games.db [--db peer.db] --out data/datasets/d1 \
        [--config node.yaml] [--window 20000] [--holdout-fraction 0.05] [--no-augment] [--overwrite]

Prints one JSON object (path, dataset_sha256, counts). Exit code 2 and a one-line message on
stderr when an input is missing, locked or corrupt; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import ConfigError, load_settings  # noqa: E402
from app.games.train.export import ExportError, WindowGrowth, export_dataset  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", action="append", required=True, type=Path, help="replay DB (repeatable)")
    parser.add_argument("--out", required=True, type=Path, help="dataset directory to create")
    parser.add_argument("--config", type=Path, help="node config YAML (export section)")
    parser.add_argument("--window", type=int, help="newest games to use (default: export.window_games)")
    parser.add_argument("--holdout-fraction", type=float, help="default: export.holdout_fraction")
    parser.add_argument("--augment", dest="augment", action="store_true", default=None)
    parser.add_argument("--no-augment", dest="augment", action="store_false")
    parser.add_argument("--game", help="expected game (default: that of the games)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing dataset directory")
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config)
        cfg = settings.export
        result = export_dataset(
            args.db, args.out,
            window_games=args.window if args.window is not None else cfg.window_games,
            holdout_fraction=args.holdout_fraction if args.holdout_fraction is not None else cfg.holdout_fraction,
            augment=cfg.augment if args.augment is None else args.augment,
            game=args.game, overwrite=args.overwrite, value_target_mix=cfg.value_target_mix,
            window_growth=WindowGrowth.from_config(cfg.window_base_games, cfg.window_alpha, cfg.window_beta),
            length_discount=settings.search.length_discount,
        )
    except (ExportError, ConfigError) as exc:
        print(f"export failed: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"path": str(result.path), "dataset_sha256": result.dataset_sha256, "counts": result.manifest["counts"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
