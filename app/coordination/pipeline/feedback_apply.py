"""The edge of the feedback loops (feedback_loops.py holds the decisions): what each loop reads
after its trigger, how its decision is persisted in the pipeline state (atomically, with the
rest of the state: a restart resumes it), the event it publishes and the metrics it sets, and
how the train and self-play steps read the decided values back.

- quality -> training runs after each export (runners._export), on a workload that scores its
  data (`steps.ScoresData`: the game workload's manifest `quality`); the next training run of
  this node takes the decided lr or batch (training_job.training_command).
- loss plateau -> exploration: in a cluster, a function of the lineage's decided records
  (each carries its final training loss and its gauntlet's games, so its score against the
  best), so every node plays with the same noise and any claimant decides the same; the node
  that decides a generation persists the result and publishes the event when that generation
  moved it. A lone node is the lineage: it decides after each generation from its run's
  result.json, kept in the state. The next self-play batch plays with the decided noise
  (GameSteps.selfplay_batch).
"""

from __future__ import annotations

import asyncio
import json
import weakref
from dataclasses import replace
from pathlib import Path
from collections.abc import Mapping
from typing import Any

from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.events import EventType
from app.coordination.pipeline import state as ps
from app.games.search.player_specs import model_sha_of_player
from app.coordination.pipeline.feedback_loops import (
    PLATEAU, QUALITY, DecidedGeneration, ExplorationDecision, Feedback, decide_exploration, decide_training,
    exploration_of, training_values,
)
from app.coordination.pipeline.generation_log import GenerationRecord
from app.coordination.pipeline.steps import Pipe, ScoresData, WorkloadSteps


def feedback_of(state: ps.PipelineState) -> Feedback:
    return Feedback.from_json(state.feedback)


async def _persist(pipe: Any, change: Any) -> None:
    """Apply `change(Feedback) -> Feedback` to the state under the pipeline's lock."""
    await pipe.update(lambda s: ps.feedback_decided(s, change(feedback_of(s)).to_json()))


async def after_export(pipe: Any, steps: WorkloadSteps, ctx: DaemonContext, generation: int, out: Path) -> None:
    """Score the export; with the quality loop on, decide the scale of the next training run."""
    if not isinstance(steps, ScoresData):
        return
    quality = await asyncio.to_thread(steps.data_quality, out)
    if quality is None:
        ctx.log.warning("data_quality_missing", generation=generation, path=str(out))
        return
    ctx.metrics.data_quality_score.set(quality.score)
    cfg = pipe.settings.feedback.quality
    if not cfg.enabled:
        return
    before = feedback_of(pipe.state).training
    decision = decide_training(before, quality.score, generation, cfg)
    await _persist(pipe, lambda fb: replace(fb, training=decision))
    ctx.metrics.training_scale.set(decision.scale)
    values = training_values(decision, pipe.settings.train, cfg.knob)
    ctx.log.info("data_quality_scored", generation=generation, score=quality.score, scale=decision.scale,
                 values=values, why=decision.reason)
    if decision.scale != before.scale:
        ctx.metrics.feedback_adjustments_total.labels(QUALITY).inc()
        await ctx.router.publish(EventType.TRAINING_ADJUSTED, {
            "generation": generation, "score": quality.score, "scale": decision.scale,
            "previous_scale": before.scale, "values": {k: float(v) for k, v in values.items()},
            "reason": decision.reason[:300]})


def train_options(pipe: Pipe, state: ps.PipelineState) -> dict[str, float | int]:
    """The trainer options the quality loop decided for this node's next run ({} when off)."""
    cfg = pipe.settings.feedback.quality
    if not cfg.enabled:
        return {}
    return training_values(feedback_of(state).training, pipe.settings.train, cfg.knob)


def final_loss(pipe: Any, run_dir: str | None) -> float | None:
    """The finished run's final loss from its result file (None when there is none)."""
    if run_dir is None:
        return None
    path = Path(run_dir) / pipe.steps.training.result_name
    try:
        return pipe.steps.training.final_loss(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def vs_best_score(evaluation: dict) -> float | None:
    """The candidate's score against the best in a gauntlet record (None: not played)."""
    for result in evaluation.get("results", []) if isinstance(evaluation, dict) else []:
        if isinstance(result, dict) and result.get("kind") == "best" and isinstance(result.get("score"), (int, float)):
            games = sum(int(result.get(k, 0) or 0) for k in ("wins", "draws", "losses"))
            return float(result["score"]) if games else None
    return None


def record_vs_best(records: Mapping[int, GenerationRecord], generation: int) -> float | None:
    """A decided generation's score against the best it played, from its record's games: the
    row of the newest earlier promoted generation's model (None: no such row)."""
    matches = records[generation].matches
    if not matches:
        return None
    earlier = [records[g].sha256 for g in sorted(records, reverse=True) if g < generation and records[g].promoted]
    rows = {model_sha_of_player(row[0]): row for row in matches["results"]}
    for sha in earlier:
        row = rows.get(sha)
        if row is not None:
            games = row[1] + row[2] + row[3]
            return (row[1] + 0.5 * row[2]) / games if games else None
    return None


def lineage_history(records: Mapping[int, GenerationRecord]) -> list[DecidedGeneration]:
    """The plateau loop's input from a lineage's decided records (pure)."""
    return [DecidedGeneration(g, records[g].promoted, records[g].loss, record_vs_best(records, g))
            for g in sorted(records)]


# pipe -> (the records folded, the decision): folded again only when the records change
_lineage_cache: weakref.WeakKeyDictionary[Any, tuple[Any, ExplorationDecision]] = weakref.WeakKeyDictionary()


def lineage_exploration(pipe: Pipe) -> ExplorationDecision:
    """The plateau loop's decision for this node: the lineage's (folded over the cluster's
    decided records, again only when they change) in a cluster, the state's on a lone node."""
    cluster = getattr(pipe, "cluster", None)
    if cluster is None:
        return feedback_of(pipe.state).exploration
    records = cluster.generations.records  # replaced, never changed in place, on every merge
    held = _lineage_cache.get(pipe)
    if held is None or held[0] is not records:
        settings = pipe.settings
        decision = exploration_of(lineage_history(records), settings.search.dirichlet_fraction,
                                  settings.feedback.plateau)
        held = (records, decision)
        _lineage_cache[pipe] = held
    return held[1]


async def after_decision(pipe: Any, ctx: DaemonContext, closed: ps.PipelineState, promoted: bool,
                         record: GenerationRecord | None = None) -> None:
    """With the plateau loop on, decide self-play's noise from the generation just decided
    (`closed`: the state as it was before the decision, with its run dir and evaluation; in a
    cluster `record`, the committed record, and the decision is the lineage's)."""
    cfg = pipe.settings.feedback.plateau
    if not cfg.enabled:
        return
    base = pipe.settings.search.dirichlet_fraction
    if record is not None and pipe.cluster is not None:
        records = {**pipe.cluster.generations.records, record.generation: record}  # gossip may lag the commit
        earlier = {g: r for g, r in records.items() if g < record.generation}
        before = exploration_of(lineage_history(earlier), base, cfg)
        decision = exploration_of(lineage_history(records), base, cfg)
        loss, vs_best = record.loss, record_vs_best(records, record.generation)
    else:
        loss = await asyncio.to_thread(final_loss, pipe, closed.run_dir)
        vs_best = vs_best_score(closed.evaluation)
        before = feedback_of(pipe.state).exploration
        decision = decide_exploration(before, loss, promoted, vs_best, closed.generation, base, cfg)
    await _persist(pipe, lambda fb: replace(fb, exploration=decision))
    previous = base if before.fraction is None else before.fraction
    ctx.metrics.selfplay_dirichlet_fraction.set(decision.fraction)
    ctx.log.info("exploration_decided", generation=closed.generation, loss=loss, vs_best=vs_best,
                 dirichlet_fraction=decision.fraction, why=decision.reason)
    if decision.fraction != previous:
        ctx.metrics.feedback_adjustments_total.labels(PLATEAU).inc()
        await ctx.router.publish(EventType.EXPLORATION_ADJUSTED, {
            "generation": closed.generation, "dirichlet_fraction": decision.fraction, "previous": previous,
            "reason": decision.reason[:300]})


def exploration(pipe: Pipe) -> ExplorationDecision | None:
    """The noise decision self-play plays with (None when the loop is off)."""
    return lineage_exploration(pipe) if pipe.settings.feedback.plateau.enabled else None


def feedback_status(pipe: Pipe) -> dict[str, Any]:
    """/status and /progress: each loop on or off, its decided value and why."""
    fb = feedback_of(pipe.state)
    settings = pipe.settings
    quality, plateau = settings.feedback.quality, settings.feedback.plateau
    if plateau.enabled:
        fb = replace(fb, exploration=lineage_exploration(pipe))
    return {
        QUALITY: {"enabled": quality.enabled, "knob": quality.knob, "scale": fb.training.scale,
                  "score": fb.training.score, "values": training_values(fb.training, settings.train, quality.knob),
                  "generation": fb.training.generation, "reason": fb.training.reason[:200]},
        PLATEAU: {"enabled": plateau.enabled,
                  "dirichlet_fraction": fb.exploration.fraction if fb.exploration.fraction is not None
                  else settings.search.dirichlet_fraction,
                  "losses": list(fb.exploration.losses), "generation": fb.exploration.generation,
                  "reason": fb.exploration.reason[:200]},
    }
