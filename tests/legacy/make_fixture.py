"""Write tests/fixtures/search_equivalence.json from the frozen per-tree search.

    PYTHONPATH=. .venv/bin/python tests/legacy/make_fixture.py
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from tests.legacy.legacy_search import SearchTree, run_searches
from tests.search_cases import GAME, SETTINGS, TableEvaluator, config_of, positions

OUT = Path(__file__).resolve().parent.parent / "fixtures" / "search_equivalence.json"


def main() -> None:
    texts = positions()
    cases = []
    for k, setting in enumerate(SETTINGS):
        name, _, sims, noise, per_round, sims_after = setting
        cfg = config_of(setting)
        chosen = [i for i in range(len(texts)) if i % len(SETTINGS) == k]
        evaluator = TableEvaluator(seed=k)
        rng = np.random.default_rng(k)
        trees = [SearchTree.for_search(GAME.parse(texts[i]), cfg) for i in chosen]
        first = run_searches(trees, evaluator, sims, cfg, rng, add_noise=noise, leaves_per_round=per_round)
        again, moves = [], []
        for tree, result in zip(trees, first):
            move = result.best_action
            tree.advance(move)
            if not tree.root_state.is_terminal:
                again.append(tree)
            moves.append(move)
        second = iter(run_searches(again, evaluator, sims_after, cfg, rng, add_noise=noise,
                                   leaves_per_round=per_round))
        for i, tree, result, move in zip(chosen, trees, first, moves):
            after = next(second) if not tree.root_state.is_terminal else None
            cases.append({
                "index": i, "moves": texts[i], "setting": name,
                "counts": result.counts.astype(int).tolist(),
                # the policy target differs from the counts only where forced playouts were pruned
                "visits": ([float(v) for v in result.visits] if cfg.forced_playouts else None),
                "root_value": result.root_value, "proven": result.proven,
                "best": move,
                "counts_after": None if after is None else after.counts.astype(int).tolist(),
                "proven_after": None if after is None else after.proven,
            })
    cases.sort(key=lambda c: c["index"])
    assert all(math.isfinite(c["root_value"]) for c in cases)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"source": "per-tree search of e1e3464 (tests/legacy/legacy_search.py)",
                               "cases": cases}, separators=(",", ":")) + "\n")
    print(f"{len(cases)} cases -> {OUT}")


if __name__ == "__main__":
    main()
