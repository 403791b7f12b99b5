"""A gauntlet's outcome as plain JSON, and the promotion decision taken from it.

The pipeline persists the evaluation between the gauntlet and the promote step, so a node
that restarts in between decides from the stored results, and decides the same way: the
gate is a pure function of them (`decide_promotion`).
"""

from __future__ import annotations

from app.games.train.gauntlet import GauntletReport, OpponentResult
from app.games.train.promotion import Decision, Gates, decide_promotion
from app.games.train.sprt import SprtDecision, SprtResult


def evaluation_from_report(report: GauntletReport) -> dict:
    """The parts of a report the gate, the Elo fit and operators need, JSON-ready."""
    data = report.to_json()
    return {"match_id": data["match_id"], "player": data["candidate"], "results": data["results"],
            "elapsed_s": data["elapsed_s"]}


def match_summary(evaluation: dict | None) -> dict | None:
    """What a decided generation's record keeps of its gauntlet (GenerationRecord.matches):
    the candidate's player and its wins, draws and losses per opponent. None for an evaluation
    that is not a gauntlet (the LM workload's held-out scores) or predates the player name."""
    if not isinstance(evaluation, dict) or not isinstance(evaluation.get("player"), str):
        return None
    results = [[r["opponent"], int(r["wins"]), int(r["draws"]), int(r["losses"])]
               for r in evaluation.get("results", []) if r.get("wins", 0) + r.get("draws", 0) + r.get("losses", 0)]
    return {"player": evaluation["player"], "results": results}


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
