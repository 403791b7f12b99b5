"""Model registry commands on one node's registry: gate a candidate, promote, roll back, list.

    python -m app.cli registry evaluate data/models/gen3.safetensors   # gauntlet + gate + promote/reject
    python -m app.cli registry promote <sha256-prefix> --reason "manual"
    python -m app.cli registry rollback <sha256-prefix> --reason "gen 5 plays badly"
    python -m app.cli registry progress          # Elo by generation, JSON
    python -m app.cli registry list
(`scripts/auto_promote.py` is a thin wrapper.) These act on one registry: a lone node's, or
for inspection. A cluster's best is rolled back with `python -m app.cli rollback`, a decision
committed through the voter quorum that every node follows.

Promotion and rollback refuse a model whose file no longer hashes to its registry sha256.
Exit status: 0 done (evaluate: promoted), 1 evaluate rejected the candidate,
2 refused or bad arguments / unusable model, config or registry, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from app.games.search.model_meta import ModelFormatError
from app.games.search.player_specs import PlayerSpecError
from app.config import ConfigError, load_settings
from app.config.paths import NodePaths
from app.db.registry import ModelRegistry, RegistryError
from app.games.train.gauntlet import format_table
from app.games.train.gauntlet_baselines import anchor_player
from app.games.train.promotion import (
    PromotionError, evaluate_candidate, progress_report, promote_model, rollback_model,
)


def parse_args(argv: list[str] | None, prog: str | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--registry", default=None,
                    help="registry SQLite file or database URL (default: <data_dir>/registry.db, the node's own)")
    ap.add_argument("--config", type=Path, default=None, help="node config YAML")
    sub = ap.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("evaluate", help="register a candidate, run the gauntlet, apply the gates")
    ev.add_argument("model", type=Path)
    ev.add_argument("--workers", type=int, default=None)
    ev.add_argument("--games", type=int, default=None, help="games per baseline (default: config)")
    ev.add_argument("--seed", type=int, default=0)
    ev.add_argument("--json", action="store_true")
    pr = sub.add_parser("promote", help="promote a candidate by hand (file sha256 checked)")
    pr.add_argument("sha256", help="sha256 or a unique prefix")
    pr.add_argument("--reason", default="manual promotion")
    rb = sub.add_parser("rollback", help="make an earlier promoted model current again")
    rb.add_argument("sha256", help="sha256 or a unique prefix of the model to return to")
    rb.add_argument("--reason", default="manual rollback")
    sub.add_parser("progress", help="Elo by generation as JSON")
    sub.add_parser("list", help="the registry as a table")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    try:
        settings = load_settings(args.config)
        registry_path = args.registry or NodePaths(settings.node.data_dir, settings.node.db_url).registry_db
        with ModelRegistry(registry_path) as registry:
            return _run(args, settings, registry)
    except (ConfigError, ModelFormatError, PlayerSpecError, RegistryError, PromotionError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace, settings, registry: ModelRegistry) -> int:
    if args.command == "evaluate":
        import torch  # the one command that runs a network here; the others only read the registry

        torch.set_num_threads(1)
        outcome = evaluate_candidate(args.model, settings, registry, workers=args.workers, seed=args.seed,
                                     games_per_baseline=args.games)
        if args.json:
            print(json.dumps({"promoted": outcome.decision.promote, "reasons": list(outcome.decision.reasons),
                              "model": outcome.entry.to_json(), "report": outcome.report.to_json()}))
        else:
            print(format_table(outcome.report))
            print()
            print(("PROMOTED " if outcome.decision.promote else "REJECTED ") + outcome.entry.sha256[:12])
            for line in outcome.decision.reasons:
                print(f"  {line}")
        return 0 if outcome.decision.promote else 1
    if args.command == "promote":
        entry = promote_model(registry, registry.find(args.sha256).sha256, args.reason)
        print(f"promoted {entry.sha256[:12]} (generation {entry.generation})")
        return 0
    if args.command == "rollback":
        target = registry.find(args.sha256)
        undone = rollback_model(registry, target.sha256, args.reason)
        print(f"current best is {target.sha256[:12]} (generation {target.generation}); "
              f"rolled back: {', '.join(s[:12] for s in undone) or 'none'}")
        return 0
    if args.command == "progress":
        print(json.dumps(progress_report(registry, anchor_player(settings)), indent=2))
        return 0
    best = registry.current_best()
    print(f"{'gen':>4} {'sha256':<12} {'status':<11} {'elo':>7} {'95% interval':>17}  reason")
    for m in registry.models():
        elo = "-" if m.elo is None else f"{m.elo:.0f}"
        ci = "-" if m.elo_low is None else f"[{m.elo_low:.0f}, {m.elo_high:.0f}]"
        mark = "*" if best is not None and m.sha256 == best.sha256 else " "
        print(f"{m.generation:>4} {m.sha256[:12]:<12}{mark}{m.status.value:<11} {elo:>7} {ci:>17}  {m.reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
