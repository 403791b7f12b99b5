"""Play a candidate against baselines (and optionally the current best); print W/D/L, score, Elo.

    python scripts/run_gauntlet.py --candidate data/models/gen3.safetensors --baselines random,heuristic
    python scripts/run_gauntlet.py --candidate A.safetensors --best current --registry data/registry.db
    python scripts/run_gauntlet.py --candidate heuristic:3 --baselines random,rollout:100 --games 20

Players: random, heuristic[:depth], rollout[:simulations], or a .safetensors model path.
Every game is recorded in the registry; Elo is refitted over all recorded games.
Exit status: 0 done, 2 bad arguments / unusable model, config or registry, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from app.games.search.model import ModelFormatError  # noqa: E402
from app.games.search.player_specs import PlayerSpecError  # noqa: E402
from app.config import ConfigError, load_settings  # noqa: E402
from app.config.paths import NodePaths
from app.db.registry import ModelRegistry, RegistryError  # noqa: E402
from app.games import GameError  # noqa: E402
from app.games.train.gauntlet import format_table, run_gauntlet  # noqa: E402


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--candidate", required=True, help="model path or baseline spec")
    ap.add_argument("--baselines", default="random,heuristic", help="comma-separated baseline specs ('' for none)")
    ap.add_argument("--best", default=None, help="model path of the current best, or 'current' (from the registry)")
    ap.add_argument("--registry", type=Path, default=None, help="registry SQLite (default: <data_dir>/registry.db, the node's own)")
    ap.add_argument("--games", type=int, default=None, help="games per baseline (default: config)")
    ap.add_argument("--workers", type=int, default=None, help="worker processes (default: config; 1 = in this process)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--config", type=Path, default=None, help="node config YAML")
    ap.add_argument("--json", action="store_true", help="print the report as one JSON object instead of a table")
    ap.add_argument("--quiet", action="store_true", help="no per-game progress on stderr")
    args = ap.parse_args(argv)
    if (args.games is not None and args.games < 1) or (args.workers is not None and args.workers < 0):
        ap.error("--games must be >= 1 and --workers >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    try:
        settings = load_settings(args.config)
        registry_path = args.registry or NodePaths(settings.node.data_dir).registry_db
        baselines = [b.strip() for b in args.baselines.split(",") if b.strip()]
        with ModelRegistry(registry_path) as registry:
            best = args.best
            if best == "current":
                entry = registry.current_best()
                if entry is None:
                    print(f"error: {registry_path} has no promoted model; omit --best", file=sys.stderr)
                    return 2
                best = entry.path

            def progress(p: dict) -> None:
                if not args.quiet:
                    print(f"  vs {p['opponent'][:24]}: {p['games']} games, +{p['wins']} ={p['draws']} -{p['losses']}",
                          file=sys.stderr, flush=True)

            report = run_gauntlet(args.candidate, baselines, best, settings, registry, workers=args.workers,
                                  seed=args.seed, progress=progress, games_per_baseline=args.games)
    except (ConfigError, ModelFormatError, PlayerSpecError, RegistryError, GameError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    print(json.dumps(report.to_json()) if args.json else format_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
