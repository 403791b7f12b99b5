"""A cluster's Elo: every generation rated from the gauntlet results its decided records carry,
the same on every node whichever node played which match; the records stay bounded."""

from __future__ import annotations

import json

import pytest

from app.coordination.pipeline.evaluation_record import match_summary
from app.coordination.pipeline.generation_elo import rate_generations
from app.coordination.pipeline.generation_log import GenerationRecord

SHAS = [f"{g:064x}" for g in range(1, 5)]


def player(g: int) -> str:
    return f"model:{SHAS[g - 1]}:s8"


def record(g: int, results: list | None, trained_by: str = "n0") -> GenerationRecord:
    matches = None if results is None else {"player": player(g), "results": results}
    return GenerationRecord(g, SHAS[g - 1], True, 10 * g, trained_by, "pass", matches=matches)


def test_candidate_vs_best_chains_rate_every_generation_from_any_node() -> None:
    """No gate: generation 1 played nothing, each later one only the previous best, on three
    different nodes. All four generations are rated, the first at 0, in order of strength."""
    records = {1: record(1, []), 2: record(2, [[player(1), 14, 2, 4]], "n1"),
               3: record(3, [[player(2), 13, 3, 4]], "n2"), 4: record(4, [[player(3), 8, 4, 8]], "n0")}
    rated = rate_generations(records)
    assert sorted(rated) == [1, 2, 3, 4]
    assert rated[1].elo == 0.0 and rated[1].low == rated[1].high == 0.0
    assert 0 < rated[2].elo < rated[3].elo and abs(rated[4].elo - rated[3].elo) < 1e-6
    assert all(r.low < r.elo < r.high for g, r in rated.items() if g > 1)
    # the same records in any order (as gossip delivers them) give the same ratings
    assert rate_generations(dict(reversed(list(records.items())))) == rated


def test_the_largest_counts_a_record_may_carry_fit_at_once() -> None:
    """Counts are summed, never expanded game by game: a record at its bounds costs nothing."""
    big = 10**6
    records = {1: record(1, [["random", big, big, big]] * 8), 2: record(2, [[player(1), big, 0, big]] * 8)}
    rated = rate_generations(records)
    assert abs(rated[1].elo) < 1 and abs(rated[2].elo - rated[1].elo) < 1


def test_where_the_games_reach_random_it_stays_the_anchor() -> None:
    records = {1: record(1, [["random", 18, 0, 2]]), 2: record(2, [["random", 19, 0, 1], [player(1), 12, 0, 8]])}
    rated = rate_generations(records)
    assert rated[1].elo > 0 and rated[2].elo > rated[1].elo
    assert rate_generations({1: record(1, None)}) == {}  # an LM record, or one from before matches


def test_a_gauntlet_evaluation_becomes_a_bounded_record_field() -> None:
    evaluation = {"match_id": "m", "player": player(2), "elapsed_s": 1.0, "results": [
        {"opponent": player(1), "kind": "best", "wins": 5, "draws": 1, "losses": 2},
        {"opponent": "random", "kind": "random", "wins": 0, "draws": 0, "losses": 0}]}
    summary = match_summary(evaluation)
    assert summary == {"player": player(2), "results": [[player(1), 5, 1, 2]]}
    assert match_summary({"kind": "lm_heldout", "candidate": {"mean": 0.5}}) is None
    rec = GenerationRecord(2, SHAS[1], True, 20, "n1", "pass", matches=summary)
    assert GenerationRecord.from_value(rec.to_value()) == rec
    assert "matches" not in GenerationRecord(1, SHAS[0], True, 10, "n0").to_json()  # older records unchanged
    for bad in ({"player": player(2)}, {"player": "", "results": []},
                {"player": player(2), "results": [[player(1), -1, 0, 0]]},
                {"player": player(2), "results": [[player(1), True, 0, 0]]},
                {"player": player(2), "results": [["x" * 201, 1, 0, 0]]},
                {"player": player(2), "results": [[player(1), 1, 0, 0]] * 9}):
        with pytest.raises(ValueError, match="matches"):
            GenerationRecord.from_value({**json.loads(rec.to_value()), "matches": bad})
    # the largest record the bounds allow still fits a committed value (app/coordination/p2p/schemas.py)
    widest = {"player": "p" * 200, "results": [["o" * 200, 10**6, 10**6, 10**6]] * 8}
    assert len(GenerationRecord(10**6, SHAS[1], True, 10**9, "n" * 128, "r" * 500, matches=widest).to_value()) < 4096


def test_every_generation_is_rated_against_the_fixed_anchor_it_played() -> None:
    """Each gauntlet played the anchor a few games: every generation is on one scale with the
    anchor at 0, and the labels name it; a run from before the anchor stays rated vs random."""
    from app.coordination.pipeline.generation_elo import generation_anchors

    records = {1: record(1, [["heuristic-d2", 0, 1, 3]]),
               2: record(2, [["heuristic-d2", 2, 0, 2], [player(1), 14, 2, 4]]),
               3: record(3, [["heuristic-d2", 4, 0, 0], [player(2), 13, 3, 4]])}
    rated = rate_generations(records, "heuristic-d2")
    assert rated[1].elo < 0 < rated[3].elo and rated[1].elo < rated[2].elo < rated[3].elo
    assert generation_anchors(records, "heuristic-d2") == {1: "heuristic-d2", 2: "heuristic-d2", 3: "heuristic-d2"}
    assert rate_generations(records) != rated  # the old default anchors the chain at generation 1
    old = {1: record(1, [["random", 18, 0, 2]]), 2: record(2, [[player(1), 12, 0, 8]])}
    assert generation_anchors(old, "heuristic-d2") == {1: "random", 2: "random"}
    assert rate_generations(old, "heuristic-d2") == rate_generations(old)
