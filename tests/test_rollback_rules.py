"""The pure rules of a cluster rollback (app/coordination/pipeline/rollback.py) and its log."""

from __future__ import annotations

import pytest

from app.coordination.pipeline.generation_log import GenerationRecord, latest_promoted
from app.coordination.pipeline.rollback import RollbackLog, RollbackRecord, effective_records, plan_rollback

pytestmark = pytest.mark.timeout(30)


def records(*promoted: bool) -> dict[int, GenerationRecord]:
    return {g: GenerationRecord(g, f"{g:064x}", p, 10 * g, "n0") for g, p in enumerate(promoted, 1)}


def test_the_default_target_is_the_current_best_and_the_best_falls_back() -> None:
    recs = records(True, False, True)
    assert plan_rollback(recs, {}, None) == (3, "")
    after = effective_records(recs, {3: RollbackRecord(3, "bad", "n1")})
    assert latest_promoted(after).generation == 1 and after[3].promoted is False
    assert max(after) == 3  # the number stays taken: the next generation is 4
    assert plan_rollback(recs, {3: None}, None)[0] is None  # generation 1 is the best, nothing before it


@pytest.mark.parametrize("generation, why", [
    (2, "was not promoted"), (1, "is not the current best"), (9, "was not promoted"),
])
def test_refusals_say_why(generation: int, why: str) -> None:
    target, reason = plan_rollback(records(True, False, True), {}, generation)
    assert target is None and why in reason


def test_a_decided_rollback_is_answered_again_not_refused() -> None:
    assert plan_rollback(records(True, True), {2: RollbackRecord(2, "x", "n0")}, 2) == (2, "")


def test_the_log_keeps_one_value_per_generation(tmp_path) -> None:
    log = RollbackLog(tmp_path / "rollbacks.json")
    first = RollbackRecord(2, "gen 2 plays badly", "n1")
    assert log.merge([first]) == []
    [conflict] = log.merge([RollbackRecord(2, "another reason", "n2")])
    assert "refused" in conflict and log.records[2] == first
    assert RollbackLog(tmp_path / "rollbacks.json").records == {2: first}
    assert RollbackRecord.from_value(first.to_value()) == first
