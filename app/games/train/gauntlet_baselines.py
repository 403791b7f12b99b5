"""Which fixed players a generation's gauntlet plays, and how many games each (pure).

The promotion gates name the baselines they need (`Gates.baselines()`: random, heuristic),
each played `gauntlet.games_vs_baseline` games. Besides them every gauntlet plays the fixed
anchor (`gauntlet.anchor`, a few `games_vs_anchor` games): the same player for every
generation, so the Elo fit pins it at 0 and every generation is rated against one reference
instead of along a chain of candidate-vs-best matches that starts at generation 1. A lone node
(`run_gauntlet`) and a cluster's shard plan (`gauntlet_plan.GauntletRequest.baselines`) both
take this list, so each baseline's game count is the same whoever plays it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from app.games.search.players import RandomPlayer, parse_player_spec
from app.config import Settings

ANCHOR_KIND = "anchor"  # the report's key for the anchor when no gate baseline is the same player


@dataclass(frozen=True)
class Baseline:
    kind: str  # the report's key: random | heuristic | rollout | anchor
    spec: str  # player spec text with its parameters spelled out, e.g. 'heuristic:2'
    games: int


def baseline_text(text: str, settings: Settings) -> str:
    """A baseline with its parameters spelled out ('heuristic' -> 'heuristic:2'), so a node with
    another config plays the same opponent."""
    spec = parse_player_spec(text, settings.gauntlet, settings.search)
    if spec.kind == "heuristic":
        return f"heuristic:{spec.depth}"
    if spec.kind == "rollout":
        return f"rollout:{spec.simulations}"
    return spec.kind


def planned_baselines(gate_kinds: Sequence[str], settings: Settings, games: int | None = None) -> list[Baseline]:
    """The gate's baselines (`games` each, default `games_vs_baseline`), then the anchor with
    `games_vs_anchor` games; an anchor that is one of the gate's players is not played twice:
    that match plays the larger of the two counts."""
    cfg = settings.gauntlet
    count = cfg.games_vs_baseline if games is None else games
    out = [Baseline(kind, baseline_text(kind, settings), count) for kind in gate_kinds]
    if cfg.anchor is None or cfg.games_vs_anchor == 0:
        return out
    text = baseline_text(cfg.anchor, settings)
    same = next((i for i, b in enumerate(out) if b.spec == text), None)
    if same is None:
        return [*out, Baseline(ANCHOR_KIND, text, cfg.games_vs_anchor)]
    out[same] = replace(out[same], games=max(out[same].games, cfg.games_vs_anchor))
    return out


def anchor_player(settings: Settings) -> str:
    """The name of the player every Elo is relative to (0): the configured anchor, or the random
    player when the anchor is off (the fit then anchors a chain without it at its first generation)."""
    cfg = settings.gauntlet
    if cfg.anchor is None:
        return RandomPlayer.name
    return parse_player_spec(cfg.anchor, cfg, settings.search).name
