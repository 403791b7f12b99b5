"""Two feedback loops a lineage runs on itself, as pure decisions (issue 52, part B).

- quality -> training: each export scores the games it took (`DataQuality`: duplicate games,
  decisive results, policy-target entropy); a poor score makes the next training gentler (its
  learning rate scaled down, or its batch scaled up), a good one steps it back toward the
  configured value. A band between `low` and `high` holds the value still (hysteresis).
- loss plateau -> exploration: after K decided generations of the lineage (its recorded
  history, whichever node trained them: `exploration_of`) whose final training losses are
  flat within a tolerance, self-play's root noise (search.dirichlet_fraction) rises by a step
  within bounds; an improvement (a loss clearly below the window's best, or a promotion that
  beat the best) lowers it by a step. A move restarts the count, so a raise needs K new flat
  generations: on constant input the value climbs to its bound and stays there.

Each decision is a function of the previous decision and the new observation, returns the new
decision with its reason, and never leaves its bounds. The edge (feedback_apply.py) reads the
observations, persists the decisions in the pipeline state, publishes their events and sets
their metrics; the train and self-play steps read the decided values from the state.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from app.config import Settings
from app.config.pipeline import PlateauLoopConfig, QualityLoopConfig, TrainConfig

QUALITY = "quality"
PLATEAU = "plateau"


@dataclass(frozen=True)
class DataQuality:
    """What an export measured of its games; every share in [0, 1]."""

    games: int
    duplicate_share: float  # games whose move sequence an earlier game of the window already had
    decisive_share: float  # games that ended in a win (not a draw)
    policy_entropy: float  # mean policy-target entropy over the positions, / log(num_actions)

    @property
    def score(self) -> float:
        """One number in [0, 1]: the mean of distinct, decisive and spread-out (equal weights)."""
        parts = (1.0 - self.duplicate_share, self.decisive_share, self.policy_entropy)
        return round(sum(min(1.0, max(0.0, p)) for p in parts) / len(parts), 6)

    @staticmethod
    def from_json(data: Any) -> DataQuality | None:
        """The manifest's `quality` object, or None when it is missing or malformed."""
        try:
            return DataQuality(int(data["games"]), float(data["duplicate_share"]), float(data["decisive_share"]),
                               float(data["policy_entropy"]))
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True)
class TrainingDecision:
    """quality -> training: the scale of the next training run (1.0 = the configured values)."""

    scale: float = 1.0
    score: float | None = None
    generation: int = 0  # the generation whose export decided it (0: none yet)
    reason: str = "no export scored yet"


def decide_training(prev: TrainingDecision, score: float, generation: int, cfg: QualityLoopConfig) -> TrainingDecision:
    """Down a step under `low`, up a step (never past 1.0) at or over `high`, held between."""
    scale = min(1.0, max(cfg.min_scale, prev.scale))
    if score < cfg.low:
        new = max(cfg.min_scale, scale * cfg.step)
        why = f"quality {score:.3f} < low {cfg.low}: scale {scale:.3f} -> {new:.3f}"
    elif score >= cfg.high:
        new = min(1.0, scale / cfg.step)
        why = f"quality {score:.3f} >= high {cfg.high}: scale {scale:.3f} -> {new:.3f}"
    else:
        new = scale
        why = f"quality {score:.3f} within [{cfg.low}, {cfg.high}): scale held at {scale:.3f}"
    if math.isclose(new, scale, rel_tol=1e-9):
        new = scale
        if score < cfg.low or score >= cfg.high:
            why = f"quality {score:.3f}: scale at its bound {scale:.3f}"
    return TrainingDecision(new, round(score, 6), generation, why)


def training_values(decision: TrainingDecision, train: TrainConfig, knob: str) -> dict[str, float | int]:
    """The trainer's options the decision sets: `lr` scaled down, or `batch_size` scaled up
    (`{}` at scale 1.0: the configured values stand)."""
    if decision.scale >= 1.0:
        return {}
    if knob == "batch_size":
        return {"batch_size": max(1, round(train.batch_size / decision.scale))}
    return {"lr": train.lr * decision.scale}


def checked_options(value: object, train: TrainConfig, cfg: QualityLoopConfig) -> dict[str, float | int]:
    """The trainer options a spanned run's claimant announced (its rendezvous), checked against
    what the quality loop could have decided from this node's settings: `lr` within
    [lr x min_scale, lr], `batch_size` within [batch_size, batch_size / min_scale]. A joiner
    trains with exactly these (every rank must derive the same schedule) or refuses to join:
    raises ValueError saying which value is out of its bounds."""
    if value is None or value == {}:
        return {}
    if not isinstance(value, dict) or not set(value) <= {"lr", "batch_size"}:
        raise ValueError(f"train options must be a dict of lr and/or batch_size, got {str(value)[:100]}")
    if not cfg.enabled:
        raise ValueError("train options announced but feedback.quality is off on this node")
    out: dict[str, float | int] = {}
    if "lr" in value:
        lr = value["lr"]
        low = train.lr * cfg.min_scale
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) \
                or not low * (1 - 1e-9) <= lr <= train.lr * (1 + 1e-9):
            raise ValueError(f"train option lr {lr!r} outside [{low:g}, {train.lr:g}]")
        out["lr"] = float(lr)
    if "batch_size" in value:
        batch = value["batch_size"]
        top = round(train.batch_size / cfg.min_scale)
        if isinstance(batch, bool) or not isinstance(batch, int) or not train.batch_size <= batch <= top:
            raise ValueError(f"train option batch_size {batch!r} outside [{train.batch_size}, {top}]")
        out["batch_size"] = batch
    return out


@dataclass(frozen=True)
class ExplorationDecision:
    """loss plateau -> exploration: self-play's root noise share (None: search.dirichlet_fraction)
    and the final losses since the last move (at most K)."""

    fraction: float | None = None
    losses: tuple[float, ...] = ()
    generation: int = 0  # the generation whose decision set it (0: none yet)
    reason: str = "no generation decided yet"


def is_flat(losses: tuple[float, ...], tolerance: float) -> bool:
    """The spread of the losses is within `tolerance` of their mean (relative)."""
    mean = sum(losses) / len(losses)
    return (max(losses) - min(losses)) <= tolerance * abs(mean)


def decide_exploration(prev: ExplorationDecision, loss: float | None, promoted: bool, vs_best: float | None,
                       generation: int, base: float, cfg: PlateauLoopConfig) -> ExplorationDecision:
    """One decided generation: `loss` its final training loss (None: unknown, counts nothing),
    `vs_best` its score against the best (None: not played). Bounds: [base, max(base, max_fraction)]."""
    top = max(base, cfg.max_fraction)
    current = min(top, max(base, base if prev.fraction is None else prev.fraction))
    history = prev.losses
    if loss is not None and math.isfinite(loss):
        improved_loss = bool(history) and loss < min(history) * (1.0 - cfg.tolerance)
        history = (*history, float(loss))[-cfg.generations:]
    else:
        improved_loss = False
    beat_best = promoted and vs_best is not None and vs_best >= cfg.improve_score
    if improved_loss or beat_best:
        new = max(base, current - cfg.step)
        cause = f"loss {loss:.4f} below the window's best" if improved_loss else f"promoted scoring {vs_best:.3f} vs best"
        return ExplorationDecision(new, history[-1:], generation,  # the new level starts the window
                                   f"improvement ({cause}): noise {current:.3f} -> {new:.3f}")
    if len(history) >= cfg.generations and is_flat(history, cfg.tolerance):
        new = min(top, current + cfg.step)
        return ExplorationDecision(new, (), generation,
                                   f"{len(history)} generations flat within {cfg.tolerance}: noise {current:.3f} -> {new:.3f}")
    return ExplorationDecision(current, history, generation,
                               f"noise held at {current:.3f} ({len(history)}/{cfg.generations} losses in the window)")


@dataclass(frozen=True)
class DecidedGeneration:
    """What the plateau loop reads of one decided generation of the lineage."""

    generation: int
    promoted: bool
    loss: float | None  # its final training loss (None: not recorded)
    vs_best: float | None  # its score against the best it played (None: not played)


def exploration_of(history: Sequence[DecidedGeneration], base: float, cfg: PlateauLoopConfig) -> ExplorationDecision:
    """The lineage's noise decision: decide_exploration folded over its decided generations in
    order. A function of the recorded history alone, so every node (whichever trained the
    last generation, or a new claimant after a leader change) decides the same."""
    decision = ExplorationDecision()
    for g in sorted(history, key=lambda d: d.generation):
        decision = decide_exploration(decision, g.loss, g.promoted, g.vs_best, g.generation, base, cfg)
    return decision


def explore_settings(settings: Settings, decision: ExplorationDecision | None) -> Settings:
    """The node's settings with self-play's decided noise share (unchanged when none is decided)."""
    if decision is None or decision.fraction is None or decision.fraction == settings.search.dirichlet_fraction:
        return settings
    return settings.model_copy(update={"search": settings.search.model_copy(
        update={"dirichlet_fraction": decision.fraction})})


# ---- the pipeline state's `feedback` object ------------------------------------------------


@dataclass(frozen=True)
class Feedback:
    """Both loops' decisions as the pipeline state keeps them (a restart resumes them)."""

    training: TrainingDecision = field(default_factory=TrainingDecision)
    exploration: ExplorationDecision = field(default_factory=ExplorationDecision)

    def to_json(self) -> dict[str, Any]:
        return {QUALITY: asdict(self.training), PLATEAU: {**asdict(self.exploration), "losses": list(self.exploration.losses)}}

    @staticmethod
    def from_json(data: dict[str, Any] | None) -> Feedback:
        """Raises ValueError/TypeError on a malformed object (the state store names the file)."""
        data = data or {}
        plateau = dict(data.get(PLATEAU) or {})
        plateau["losses"] = tuple(float(x) for x in plateau.get("losses", ()))
        return Feedback(TrainingDecision(**(data.get(QUALITY) or {})), ExplorationDecision(**plateau))
