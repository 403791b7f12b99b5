"""Leaf evaluators for the search: a network, a uniform prior, random rollouts.

Every evaluator answers one batch at a time, because the search gathers one leaf from each
of many concurrent games and asks once:

    priors, values = evaluator.evaluate(states)   # (N, A) over legal moves, (N,) side to move

Priors are zero on illegal moves and sum to 1 over legal ones; values are in [-1, 1] from
the view of the side to move in each state. States passed in are never terminal (the
search values those exactly itself).

- `NetworkEvaluator(net, game)`: one batched forward pass (`app.ai.model.predict`), its
  input made by the game in one batch (`Game.stacked_planes`, `Game.stacked_legal_masks`).
- `UniformEvaluator(game)`: uniform prior, value 0 -- the bootstrap before any model exists;
  the search then learns only from terminal states it reaches.
- `RolloutEvaluator(game, rollouts_per_leaf, rng)`: uniform prior, value = mean of random
  playouts; vectorised numpy bitboards for Connect Four, a slow generic loop otherwise.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from app.ai.model import PolicyValueNet, predict
from app.games import Game, GameState


class Evaluator(Protocol):
    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        """(N, A) priors over legal moves and (N,) values from each side to move's view."""
        ...


def legal_masks(states: Sequence[GameState]) -> np.ndarray:
    return np.stack([s.legal_mask() for s in states])


def uniform_priors(states: Sequence[GameState]) -> np.ndarray:
    legal = legal_masks(states).astype(np.float64)
    counts = legal.sum(axis=1, keepdims=True)
    return legal / np.maximum(counts, 1.0)


class NetworkEvaluator:
    """Evaluates a batch with one forward pass of a policy/value network.

    Counts `positions` and `batches` evaluated, so callers can report throughput. The network
    may live on a GPU (`selfplay.device`); `predict` moves each batch there and back. The
    game makes the batch's planes and legal masks at once: one state at a time they cost
    ~13 us a leaf, a quarter of a simulation where the network runs on a GPU.
    """

    def __init__(self, net: PolicyValueNet, game: Game) -> None:
        self.net = net.eval()
        self.game = game
        self.positions = 0
        self.batches = 0

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        planes = self.game.stacked_planes(states)
        legal = self.game.stacked_legal_masks(states)
        self.positions += len(states)
        self.batches += 1
        return predict(self.net, planes, legal)


class UniformEvaluator:
    """Uniform prior over legal moves and value 0: search guided by terminal states only."""

    def __init__(self, game: Game | None = None) -> None:
        self.game = game
        self.positions = 0
        self.batches = 0

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(states)
        self.batches += 1
        return uniform_priors(states), np.zeros(len(states), dtype=np.float64)


class RolloutEvaluator:
    """Uniform prior; value = mean result of `rollouts_per_leaf` uniformly random games."""

    def __init__(self, game: Game, rollouts_per_leaf: int = 16, rng: np.random.Generator | None = None) -> None:
        if rollouts_per_leaf < 1:
            raise ValueError(f"rollouts_per_leaf must be >= 1, got {rollouts_per_leaf}")
        self.game = game
        self.rollouts_per_leaf = rollouts_per_leaf
        self.rng = rng if rng is not None else np.random.default_rng()
        self.positions = 0
        self.batches = 0
        if game.name == "connect4":
            from app.games.connect4_playouts import playout_values

            self._values = lambda states: playout_values(states, self.rollouts_per_leaf, self.rng)
        else:
            self._values = self._generic_values

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(states)
        self.batches += 1
        return uniform_priors(states), self._values(states)

    def _generic_values(self, states: Sequence[GameState]) -> np.ndarray:
        """Any game through its GameState interface: correct, but a Python loop per move."""
        out = np.zeros(len(states), dtype=np.float64)
        for i, start in enumerate(states):
            total = 0.0
            for _ in range(self.rollouts_per_leaf):
                state = start
                while not state.is_terminal:
                    moves = state.legal_moves()
                    state = state.play(moves[int(self.rng.integers(len(moves)))])
                if state.winner is not None:
                    total += 1.0 if state.winner == start.to_move else -1.0
            out[i] = total / self.rollouts_per_leaf
        return out
