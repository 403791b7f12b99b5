"""The heuristic baseline's brain: win now, block now, else a shallow search, centre first.

A candidate that cannot beat this has learnt less than a few lines of tactics, so the gate
uses it as its middle rung between random and the current best. A game may give its own
(`Game.heuristic_scores`: the default game's bitboard negamax scores open threats and
centre stones); any other game falls back to a search over the state interface with terminal
results only (negamax for two seats, max^n for more).
"""

from __future__ import annotations

import numpy as np

from app.games import DEFAULT_GAME, GameState, get_game

WIN_SCORE = 10_000.0


def generic_move_scores(state: GameState, depth: int, num_players: int = 2) -> dict[int, float]:
    """Any game: max^n over the state interface (negamax for two seats), terminal results
    only (0 elsewhere), each seat's entry scaled by WIN_SCORE plus the depth left (a sooner
    result weighs more: a win now beats a win later); the mover's entry scores a move."""

    def maxn(s: GameState, d: int) -> np.ndarray:
        if s.is_terminal:
            return np.asarray(s.returns(), dtype=np.float64) * (WIN_SCORE + d)  # sooner counts more
        if d == 0:
            return np.zeros(num_players)
        best = None
        for a in s.legal_moves():
            v = maxn(s.play(a), d - 1)
            if best is None or v[s.to_move] > best[s.to_move]:
                best = v
        return best

    mover = state.to_move
    return {a: float(maxn(state.play(a), max(depth - 1, 0))[mover]) for a in state.legal_moves()}


def heuristic_move(state: GameState, depth: int, rng: np.random.Generator, game_name: str = DEFAULT_GAME) -> int:
    """The heuristic's move: the best score, ties to the action nearest the centre, then at
    random. `game_name` "generic" uses the state-interface search whatever the game."""
    game = None if game_name == "generic" else get_game(game_name)
    scores = None if game is None else game.heuristic_scores(state, depth)
    if scores is None:
        scores = generic_move_scores(state, depth, game.num_players if game is not None else 2)
    if not scores:
        raise ValueError(f"no legal move in position {state.to_text()!r}")
    num_actions = len(state.legal_mask())
    centre = (num_actions - 1) / 2.0
    best = max(scores.values())
    tied = [a for a, s in scores.items() if s >= best - 1e-9]
    nearest = min(abs(a - centre) for a in tied)
    tied = [a for a in tied if abs(a - centre) == nearest]
    return int(tied[0] if len(tied) == 1 else rng.choice(tied))
