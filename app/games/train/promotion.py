"""Promotion: the gate decision (pure), the registry actions around it, and progress data.

`decide_promotion` looks only at match results and the configured gates, so every
combination is tested directly; the actions that follow it (register, promote, reject,
roll back) touch the registry and the model file. A model is never made current unless
the file on disk still hashes to the sha256 the registry knows it by: what the mesh then
distributes is exactly what the gauntlet measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence, TypeVar

from app.games.search.model_meta import ModelFormatError, file_sha256, read_meta
from app.games.search.player_specs import model_sha_of_player
from app.config import Settings
from app.shared.manifests import verify_stored_model
from app.config.pipeline import PromotionConfig
from app.db.registry import ModelEntry, ModelRegistry, ModelStatus, RegistryError
from app.games.train.gauntlet import GauntletReport, ProgressCallback, registry_rating_order, run_gauntlet
from app.games.train.gauntlet_baselines import planned_baselines
from app.games.train.elo import chain_anchors
from app.games.train.sprt import SprtDecision, SprtResult

PROGRESS_FORMAT = 1
T = TypeVar("T")


class PromotionError(RuntimeError):
    """A promotion or rollback refused: unknown model, wrong state, or a file that changed."""


class MatchResult(Protocol):
    """What the gate reads from a match (app.games.train.gauntlet.OpponentResult has it)."""

    kind: str
    wins: int
    draws: int
    losses: int
    sprt: SprtResult | None


@dataclass(frozen=True)
class Gates:
    min_score_vs_random: float | None = 0.95
    min_score_vs_heuristic: float | None = 0.5
    require_sprt_vs_best: bool = True
    sprt_overrides_baselines: bool = True

    @staticmethod
    def from_config(cfg: PromotionConfig, generation: int | None = None) -> "Gates":
        """The configured gates; with `generation`, those that generation faces (the same rule
        for the daemons and the CLI)."""
        gates = Gates(cfg.min_score_vs_random, cfg.min_score_vs_heuristic, cfg.require_sprt_vs_best,
                      cfg.sprt_overrides_baselines)
        return gates if generation is None else gates.for_generation(generation, cfg.heuristic_gate_from_generation)

    def for_generation(self, generation: int, heuristic_from: int) -> "Gates":
        """The gates a given generation faces: no heuristic gate before `heuristic_from`."""
        if generation >= heuristic_from:
            return self
        return Gates(self.min_score_vs_random, None, self.require_sprt_vs_best, self.sprt_overrides_baselines)

    def baselines(self) -> list[str]:
        """The baselines a gauntlet must play for these gates to be decidable."""
        out = []
        if self.min_score_vs_random is not None:
            out.append("random")
        if self.min_score_vs_heuristic is not None:
            out.append("heuristic")
        return out


@dataclass(frozen=True)
class Decision:
    promote: bool
    reasons: tuple[str, ...]  # one line per gate, 'pass: ...' or 'fail: ...'

    def summary(self) -> str:
        return "; ".join(self.reasons)


def _score(r: MatchResult) -> float:
    n = r.wins + r.draws + r.losses
    return (r.wins + 0.5 * r.draws) / n if n else 0.0


def decide_promotion(results: Sequence[MatchResult], gates: Gates, has_best: bool) -> Decision:
    """Promote only when every configured gate passes. Generation 0 (no current best) is
    judged on the baselines alone. A gate without games fails: no evidence is not a pass.

    With `sprt_overrides_baselines`, a candidate the SPRT accepts as stronger than the current
    best is promoted whatever its baseline scores (a miss is reported as `overridden: ...`):
    a fixed threshold vs the heuristic once rejected a generation that beat the best and
    played more perfect moves (51 % vs 39 % on the solver-scored positions)."""
    by_kind = {r.kind: r for r in results}
    best = by_kind.get("best")
    beat_best = (has_best and gates.require_sprt_vs_best and gates.sprt_overrides_baselines
                 and best is not None and best.sprt is not None and best.sprt.decision is SprtDecision.ACCEPT)
    miss = "overridden (the SPRT accepts it vs the best)" if beat_best else "fail"
    reasons: list[str] = []
    ok = True
    for kind, threshold in (("random", gates.min_score_vs_random), ("heuristic", gates.min_score_vs_heuristic)):
        if threshold is None:
            continue
        r = by_kind.get(kind)
        if r is None or r.wins + r.draws + r.losses == 0:
            ok &= beat_best
            reasons.append(f"{miss}: no games vs {kind} (gate needs score >= {threshold:.2f})")
            continue
        score = _score(r)
        passed = score >= threshold
        ok &= passed or beat_best
        reasons.append(f"{'pass' if passed else miss}: score {score:.3f} vs {kind} "
                       f"{'>=' if passed else '<'} {threshold:.2f} ({r.wins}W {r.draws}D {r.losses}L)")
    if not has_best:
        reasons.append("pass: no current best (generation 0): SPRT gate not applicable")
    elif gates.require_sprt_vs_best:
        r = by_kind.get("best")
        if r is None or r.sprt is None:
            ok = False
            reasons.append("fail: no SPRT result vs the current best")
        elif r.sprt.decision is SprtDecision.ACCEPT:
            reasons.append(f"pass: SPRT accepts vs best after {r.sprt.games} games (LLR {r.sprt.llr:+.2f})")
        else:
            ok = False
            what = "rejects" if r.sprt.decision is SprtDecision.REJECT else "undecided at the game cap"
            reasons.append(f"fail: SPRT {what} vs best after {r.sprt.games} games (LLR {r.sprt.llr:+.2f}, "
                           f"score {_score(r):.3f})")
    if not reasons:  # no baseline threshold and no SPRT: AlphaZero's continuous promotion
        reasons.append("pass: no gate configured (every candidate is promoted; the gauntlet only measures)")
    return Decision(ok, tuple(reasons))


# --- registry actions ----------------------------------------------------------------------


def verify_model_file(entry: ModelEntry) -> None:
    """Refuse a model whose stored copy is gone or no longer what its registry sha256 names (a
    model file, or a model directory with its manifest: app/shared/manifests.py)."""
    problem = verify_stored_model(entry.path, entry.sha256)
    if problem is not None:
        raise PromotionError(f"refusing model {entry.sha256[:12]}: {problem}")


def register_candidate(registry: ModelRegistry, model_path: str | Path) -> ModelEntry:
    """Register a model file as a candidate, lineage from its sidecar; the file must match it."""
    path = Path(model_path)
    if not path.is_file():
        raise PromotionError(f"{path}: model file not found")
    try:
        meta = read_meta(path)
    except ModelFormatError as exc:
        raise PromotionError(str(exc)) from None
    actual = file_sha256(path)
    if actual != meta.sha256:
        raise PromotionError(f"{path}: sha256 {actual[:12]} does not match its sidecar ({str(meta.sha256)[:12]})")
    return registry.register(actual, path.resolve(), meta.generation, meta.parent_sha256, meta.dataset_sha256)


def promote_model(registry: ModelRegistry, sha256: str, reason: str) -> ModelEntry:
    verify_model_file(registry.require(sha256))
    return _refusal_as_promotion_error(registry.promote, sha256, reason)


def reject_model(registry: ModelRegistry, sha256: str, reason: str) -> ModelEntry:
    return _refusal_as_promotion_error(registry.reject, sha256, reason)


def rollback_model(registry: ModelRegistry, to_sha256: str, reason: str) -> list[str]:
    """Make an earlier promoted model current again (its file verified); returns those rolled back."""
    verify_model_file(registry.require(to_sha256))
    return _refusal_as_promotion_error(registry.rollback, to_sha256, reason)


def _refusal_as_promotion_error(action: Callable[[str, str], T], sha256: str, reason: str) -> T:
    """The registry's state machine refusing (RegistryError) is the caller's PromotionError."""
    try:
        return action(sha256, reason)
    except RegistryError as exc:
        raise PromotionError(str(exc)) from None


@dataclass(frozen=True)
class PromotionOutcome:
    entry: ModelEntry  # the candidate's registry row after the decision
    decision: Decision
    report: GauntletReport


def evaluate_candidate(
    model_path: str | Path, settings: Settings, registry: ModelRegistry,
    workers: int | None = None, seed: int = 0, progress: ProgressCallback | None = None,
    games_per_baseline: int | None = None,
) -> PromotionOutcome:
    """Register, play the gauntlet the gates need, decide, and promote or reject."""
    entry = register_candidate(registry, model_path)
    if entry.status is not ModelStatus.CANDIDATE:
        raise PromotionError(f"model {entry.sha256[:12]} is already {entry.status.value}: {entry.reason}")
    gates = Gates.from_config(settings.promotion, entry.generation)
    best = registry.current_best()
    if best is not None:
        verify_model_file(best)  # the match must be against the model the registry promoted
    report = run_gauntlet(
        model_path, planned_baselines(gates.baselines(), settings, games_per_baseline),
        None if best is None else best.path, settings, registry, workers=workers, seed=seed, progress=progress)
    decision = decide_promotion(report.results, gates, has_best=best is not None)
    if decision.promote:
        entry = promote_model(registry, entry.sha256, decision.summary())
    else:
        entry = reject_model(registry, entry.sha256, decision.summary())
    return PromotionOutcome(registry.require(entry.sha256), decision, report)


def model_anchors(registry: ModelRegistry, anchor: str = "random") -> dict[str, str]:
    """sha256 -> what its registry Elo is relative to ("heuristic-d2", "random", "generation 1"),
    as recompute_ratings anchors it: `anchor` where the games reach it, else random, else the
    chain's earliest generation."""
    generation = {m.sha256: m.generation for m in registry.models()}
    games = registry.match_results()
    out: dict[str, str] = {}
    for player, relative_to in chain_anchors(games, anchor, registry_rating_order(registry, games)).items():
        sha = model_sha_of_player(player)
        if sha is None or sha in out:
            continue
        anchor_sha = model_sha_of_player(relative_to)
        out[sha] = f"generation {generation[anchor_sha]}" if anchor_sha in generation else relative_to
    return out


def progress_report(registry: ModelRegistry, anchor: str = "random") -> dict:
    """Elo by generation for operators (served as /progress). Shape (format 1):

    {"format": 1, "anchor": what the Elo values are relative to (`anchor`: the fixed anchor
     every gauntlet plays, e.g. "heuristic-d2"; "random" or "generation 1" for games without it; or
     several, comma separated, when the games form separate chains; null with no rated model),
     "current_best": sha256 | null,
     "models": [{"generation", "sha256", "status", "reason", "elo", "elo_low", "elo_high",
                 "parent_sha256", "dataset_sha256", "created_at", "promoted_at", "current",
                 "elo_anchor"}, ...]
                 ordered by generation then registration,
     "baselines": [{"player", "elo", "elo_low", "elo_high", "games"}, ...] strongest first}

    Elo values are null until the model has rated games.
    """
    best = registry.current_best()
    anchors = model_anchors(registry, anchor)
    models = [{
        "generation": m.generation, "sha256": m.sha256, "status": m.status.value, "reason": m.reason,
        "elo": m.elo, "elo_low": m.elo_low, "elo_high": m.elo_high,
        "parent_sha256": m.parent_sha256, "dataset_sha256": m.dataset_sha256,
        "created_at": m.created_at, "promoted_at": m.promoted_at,
        "current": best is not None and m.sha256 == best.sha256,
        "elo_anchor": anchors.get(m.sha256) if m.elo is not None else None,
    } for m in registry.models()]
    baselines = [{"player": r.player, "elo": r.elo, "elo_low": r.elo_low, "elo_high": r.elo_high, "games": r.games}
                 for r in registry.ratings() if not r.player.startswith("model:")]
    named = sorted({m["elo_anchor"] for m in models if m["elo_anchor"]})
    return {"format": PROGRESS_FORMAT, "anchor": ", ".join(named) if named else None,
            "current_best": None if best is None else best.sha256,
            "models": models, "baselines": baselines}
