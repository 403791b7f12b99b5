"""Uniformly random Connect Four playouts, many games at once on numpy uint64 bitboards.

A rollout evaluator needs tens of thousands of random games per second; a Python loop of
`state.play` manages a few thousand. So every game in a batch advances one move per step
with whole-array operations (pick a random legal column, drop the stone, test for four),
and games that end drop out of the arrays. The bitboard layout is `connect4`'s (Pons'):
column c holds bits c*7 .. c*7+5, bit c*7+6 is an always-empty sentinel.

This is the one Connect Four-specific piece of the rollout machinery; `RolloutEvaluator`
in app/games/search/evaluators.py dispatches here by game name.
"""

from __future__ import annotations

import numpy as np

from app.games.connect4_arrays import HEIGHT, WIDTH, has_four_many

_COLUMN_BITS = HEIGHT + 1
_BOTTOM = np.array([1 << (c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_TOP = np.array([1 << (HEIGHT - 1 + c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_COLUMN = np.array([((1 << HEIGHT) - 1) << (c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_FULL = np.uint64(sum(((1 << HEIGHT) - 1) << (c * _COLUMN_BITS) for c in range(WIDTH)))


def random_playouts(position: np.ndarray, mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Play every (position, mask) start to the end with uniformly random legal moves.

    `position` holds the stones of the side to move, `mask` all stones (as in Connect4State).
    Returns int8 per start from that side to move's view: +1 win, 0 draw, -1 loss. A start
    that is already over (the previous mover has four, or the board is full) scores as it
    stands, so callers need not filter terminal positions out.
    """
    position = np.asarray(position, dtype=np.uint64).copy()
    mask = np.asarray(mask, dtype=np.uint64).copy()
    result = np.zeros(position.shape[0], dtype=np.int8)
    lost = has_four_many(position ^ mask)
    result[lost] = -1
    live = ~lost & (mask != _FULL)
    index = np.flatnonzero(live)
    position, mask = position[live], mask[live]
    step = 0
    while index.size:
        legal = (mask[:, None] & _TOP[None, :]) == 0
        column = np.where(legal, rng.random(legal.shape, dtype=np.float32), -1.0).argmax(axis=1)
        stone = (mask + _BOTTOM[column]) & _COLUMN[column]
        mover = position | stone
        mask = mask | stone
        won = has_four_many(mover)
        # The side to move at the start moves on even steps.
        result[index[won]] = 1 if step % 2 == 0 else -1
        keep = ~won & (mask != _FULL)
        index = index[keep]
        position = (mover ^ mask)[keep]  # the opponent's stones: the next side to move
        mask = mask[keep]
        step += 1
    return result


def playout_values(words: np.ndarray, rollouts: int, rng: np.random.Generator) -> np.ndarray:
    """Mean result of `rollouts` random games from each position of a batch (the (N, 2) words
    of `connect4_arrays`), from its side to move's view, float64."""
    if rollouts < 1:
        raise ValueError(f"rollouts must be >= 1, got {rollouts}")
    outcomes = random_playouts(np.repeat(words[:, 0], rollouts), np.repeat(words[:, 1], rollouts), rng)
    return outcomes.reshape(len(words), rollouts).mean(axis=1, dtype=np.float64)
