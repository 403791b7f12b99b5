"""The array search answers what the per-tree search it replaced answered (issue 47's
acceptance): on 500 positions, with a fixed evaluator (a seeded table of priors and values)
and the same noise (the same generator, drawn in the same order), the root visit counts are
equal, before and after a move on the reused tree, and so are proofs, root values and the
policy targets of forced playouts. The per-tree answers were recorded before that search was
removed (tests/fixtures/search_equivalence.json, tests/search_cases.py says how)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from app.games.search.mcts import SearchForest
from tests.search_cases import GAME, POSITIONS, SETTINGS, TableEvaluator, config_of, positions

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "search_equivalence.json"


def recorded() -> list[dict]:
    cases = json.loads(FIXTURE.read_text())["cases"]
    assert len(cases) == POSITIONS
    return cases


def test_the_fixture_is_the_positions_the_cases_name() -> None:
    assert [c["moves"] for c in recorded()] == positions()


@pytest.mark.parametrize("k", range(len(SETTINGS)))
def test_root_visit_counts_equal_the_per_tree_search(k: int) -> None:
    name, _, sims, noise, per_round, sims_after = SETTINGS[k]
    cfg = config_of(SETTINGS[k])
    cases = [c for c in recorded() if c["setting"] == name]
    assert len(cases) == POSITIONS // len(SETTINGS)
    evaluator = TableEvaluator(seed=k)
    rng = np.random.default_rng(k)
    forest = SearchForest.for_search(GAME, cfg, capacity=64)  # small: growing mid-search is checked too
    slots = [forest.add(GAME.parse(c["moves"])) for c in cases]
    first = forest.search(slots, evaluator, sims, cfg, rng, add_noise=noise, leaves_per_round=per_round)
    for case, result in zip(cases, first):
        assert result.counts.astype(int).tolist() == case["counts"], case["moves"]
        assert result.proven == case["proven"], case["moves"]
        assert result.root_value == case["root_value"], case["moves"]
        assert result.best_action == case["best"], case["moves"]
        if case["visits"] is not None:
            assert result.visits.tolist() == case["visits"], case["moves"]
    again = []
    for slot, case in zip(slots, cases):
        forest.advance(slot, case["best"])
        if not forest.root_state(slot).is_terminal:
            again.append((slot, case))
    second = forest.search([s for s, _ in again], evaluator, sims_after, cfg, rng, add_noise=noise,
                           leaves_per_round=per_round)
    for (slot, case), result in zip(again, second):
        assert result.counts.astype(int).tolist() == case["counts_after"], case["moves"]
        assert result.proven == case["proven_after"], case["moves"]
    assert len(again) == sum(c["counts_after"] is not None for c in cases)
    assert sum(c["proven"] is not None for c in cases) > 0 or name == "plain"
