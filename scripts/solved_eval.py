#!/usr/bin/env python
"""Score a model on the solver-scored positions: exact-move and outcome accuracy.

    python scripts/solved_eval.py --model data/models/<sha>.safetensors --sims 0,400
    python scripts/solved_eval.py --model M --sims 0 --dataset data/datasets/gen_0014

`--sims` lists budgets: 0 is the raw network, scored by its policy argmax ("raw") and by its
value head one ply deep ("value": the move whose position it rates best), N > 0 a noise-free
MCTS of N simulations per position. Positions default to ../shared/benchmarks/connect4/move_scores.txt
beside the repository. `--dataset` adds `coverage`: the raw network's accuracy on the positions
that dataset trains on and on those it never saw. Prints one JSON object; exit 2 when the model,
the positions or the dataset cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.games.search.model import ModelFormatError, load_model  # noqa: E402
from app.config import ConfigError, load_settings  # noqa: E402
from app.games.train.dataset import DatasetError, load_dataset  # noqa: E402
from app.games.train.solved_eval import (  # noqa: E402
    SolvedEvalError, coverage, default_positions_path, load_positions, network_choices, random_mover_accuracy,
    score_model, seen_in,
)


def parse_budgets(text: str) -> list[int]:
    budgets = [int(x) for x in text.split(",") if x.strip()]
    if not budgets or any(b < 0 for b in budgets):
        raise ValueError(f"--sims wants comma-separated budgets >= 0, got {text!r}")
    return budgets


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, required=True, help="model .safetensors (with its .json sidecar)")
    p.add_argument("--sims", default="0,400", help="comma-separated budgets, 0 = raw network (default: %(default)s)")
    p.add_argument("--positions", type=Path, default=None, help="move_scores.txt (default: the shared benchmark)")
    p.add_argument("--config", type=Path, default=None, help="node config YAML (search settings: c_puct)")
    p.add_argument("--limit", type=int, default=0, help="score only the first N positions (0: all)")
    p.add_argument("--dataset", type=Path, default=None,
                   help="an exported dataset dir: split the raw network's accuracy by seen / unseen positions")
    args = p.parse_args(argv)
    try:
        budgets = parse_budgets(args.sims)
    except ValueError as exc:
        p.error(str(exc))
    torch.set_num_threads(1)
    try:
        settings = load_settings(args.config)
        positions = load_positions(args.positions or default_positions_path(ROOT))
        net, meta = load_model(args.model, expect_game="connect4")
        dataset = load_dataset(args.dataset) if args.dataset is not None else None
    except (SolvedEvalError, ModelFormatError, ConfigError, DatasetError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit > 0:
        positions = positions[:args.limit]
    report = score_model(net, positions, budgets, settings.search)
    if dataset is not None:
        report["coverage"] = {"dataset": str(args.dataset),
                              **coverage(positions, network_choices(net, positions), seen_in(positions, dataset.train.planes))}
    print(json.dumps({"model": str(args.model), "generation": meta.generation,
                      "random_mover": random_mover_accuracy(positions), **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
