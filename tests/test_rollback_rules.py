"""The pure rules of a cluster rollback (app/coordination/pipeline/rollback.py) and its log."""

from __future__ import annotations

import pytest

from app.coordination.pipeline.generation_log import GenerationRecord, latest_promoted, trainer_head
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


def test_the_trainer_head_is_the_newest_kept_candidate_unless_its_best_was_rolled_back() -> None:
    recs = records(True, False, True)
    assert trainer_head(recs).generation == 3  # no head kept: the best
    recs[4] = GenerationRecord(4, "4" * 64, False, 40, "n0", head=True)
    recs[5] = GenerationRecord(5, "5" * 64, False, 50, "n1", head=True)
    assert trainer_head(effective_records(recs, {})).generation == 5  # runs on from the newest head
    assert GenerationRecord.from_value(recs[5].to_value()) == recs[5]
    assert "head" not in recs[3].to_json()  # records without a head stay byte for byte as they were
    rolled = effective_records(recs, {3: RollbackRecord(3, "bad", "n1")})
    assert not rolled[4].head and not rolled[5].head  # they ran on from generation 3
    assert trainer_head(rolled).generation == 1
    recs[6] = GenerationRecord(6, "6" * 64, False, 60, "n0")  # regressed past the margin: back to the best
    assert trainer_head(effective_records(recs, {})).generation == 3


def test_the_log_keeps_one_value_per_generation(tmp_path) -> None:
    log = RollbackLog(tmp_path / "rollbacks.json")
    first = RollbackRecord(2, "gen 2 plays badly", "n1")
    assert log.merge([first]) == []
    [conflict] = log.merge([RollbackRecord(2, "another reason", "n2")])
    assert "refused" in conflict and log.records[2] == first
    assert RollbackLog(tmp_path / "rollbacks.json").records == {2: first}
    assert RollbackRecord.from_value(first.to_value()) == first
