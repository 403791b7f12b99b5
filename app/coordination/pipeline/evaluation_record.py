"""A gauntlet's outcome as plain JSON, and the promotion decision taken from it.

The pipeline persists the evaluation between the gauntlet and the promote step, so a node
that restarts in between decides from the stored results, and decides the same way: the
gate is a pure function of them (`decide_promotion`).
"""

from __future__ import annotations

from app.training.gauntlet import GauntletReport, OpponentResult
from app.training.promotion import Decision, Gates, decide_promotion
from app.training.sprt import SprtDecision, SprtResult


def evaluation_from_report(report: GauntletReport) -> dict:
    """The parts of a report the gate and operators need, JSON-ready."""
    data = report.to_json()
    return {"match_id": data["match_id"], "results": data["results"], "elapsed_s": data["elapsed_s"]}


def _result_from_json(data: dict) -> OpponentResult:
    sprt = data.get("sprt")
    return OpponentResult(
        opponent=data["opponent"], kind=data["kind"], wins=int(data["wins"]), draws=int(data["draws"]),
        losses=int(data["losses"]), stopped=data.get("stopped", "fixed"),
        sprt=None if sprt is None else SprtResult(
            SprtDecision(sprt["decision"]), float(sprt["llr"]), float(sprt["lower"]),
            float(sprt["upper"]), int(sprt["games"])),
    )


def decide_from_evaluation(evaluation: dict, gates: Gates, has_best: bool) -> Decision:
    return decide_promotion([_result_from_json(r) for r in evaluation["results"]], gates, has_best)
