#!/usr/bin/env python
"""Score a model on the solver-scored positions: exact-move and outcome accuracy.

    python scripts/solved_eval.py --model data/models/<sha>.safetensors --sims 0,400

`--sims` lists budgets: 0 is the raw network's policy argmax, N > 0 a noise-free MCTS of N
simulations per position. Positions default to ../shared/benchmarks/connect4/move_scores.txt
beside the repository. Prints one JSON object; exit 2 when the model or positions cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from app.ai.model import ModelFormatError, load_model  # noqa: E402
from app.config import ConfigError, load_settings  # noqa: E402
from app.training.solved_eval import (  # noqa: E402
    SolvedEvalError, default_positions_path, load_positions, random_mover_accuracy, score_model,
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
    except (SolvedEvalError, ModelFormatError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit > 0:
        positions = positions[:args.limit]
    report = score_model(net, positions, budgets, settings.search)
    print(json.dumps({"model": str(args.model), "generation": meta.generation,
                      "random_mover": random_mover_accuracy(positions), **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
