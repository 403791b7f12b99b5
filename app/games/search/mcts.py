"""PUCT Monte Carlo tree search: the public face of the array search.

Self-play, the gauntlet's players, solved-position scoring and app.analyze use exactly this:

    forest = SearchForest.for_search(game, cfg)      # app/games/search/search_forest.py: all trees, one set of arrays
    slots = [forest.add(state) for state in states]
    results = forest.search(slots, evaluator, simulations, cfg, rng, add_noise=False)
    action = choose_action(results[0].visits, temperature_for_ply(ply, cfg.temperature_moves), rng)
    forest.advance(slots[0], action)                 # reuse: the chosen subtree's visits stay

    result = search(state, evaluator, simulations, cfg, rng)   # one position, a forest of one
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from app.games.search.search_forest import SearchForest
from app.games.search.search_result import SearchResult, choose_action, temperature_for_ply
from app.games import DEFAULT_GAME, Game, GameState, get_game

if TYPE_CHECKING:
    from app.games.search.evaluators import Evaluator
    from app.config.pipeline import SearchConfig

__all__ = ["SearchForest", "SearchResult", "choose_action", "search", "temperature_for_ply"]


def search(state: GameState, evaluator: "Evaluator", simulations: int, cfg: "SearchConfig",
           rng: np.random.Generator | None = None, add_noise: bool = False, leaves_per_round: int = 1,
           game: Game | None = None) -> SearchResult:
    """One search of one position (of `game`, the default game unless given) in a forest of its own."""
    forest = SearchForest.for_search(game or get_game(DEFAULT_GAME), cfg)
    slot = forest.add(state)
    rng = rng if rng is not None else np.random.default_rng()
    return forest.search([slot], evaluator, simulations, cfg, rng, add_noise, leaves_per_round)[0]
