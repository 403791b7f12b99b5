"""Leaf evaluators for the search: a network, a uniform prior, random rollouts.

Every evaluator answers one batch at a time, because the search gathers one leaf from each
of many concurrent games and asks once, with the positions in the game's batch form (a
uint64 array of words, `Game.state_words`), so its input is made by array operations:

    priors, values = evaluator.evaluate_batch(words)   # (N, A) over legal moves, (N,) side to move
    priors, values = evaluator.evaluate(states)        # the same for GameState objects

Priors are zero on illegal moves and sum to 1 over legal ones; values are in [-1, 1] from
the view of the side to move in each state. Positions passed in are never finished (the
search values those exactly itself).

- `NetworkEvaluator(net, game)`: one batched forward pass (`app.ai.model.predict`), its
  input made by the game from the words (`Game.words_planes`, `Game.words_legal_masks`).
- `UniformEvaluator(game)`: uniform prior, value 0 -- the bootstrap before any model exists;
  the search then learns only from terminal states it reaches.
- `RolloutEvaluator(game, rollouts_per_leaf, rng)`: uniform prior, value = mean of random
  playouts on the vectorised Connect Four bitboards.
- `SharedNetworkClient` (app/ai/network_server.py): the same answers from a network served
  to several search processes at once.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from app.ai.model import PolicyValueNet, predict
from app.games import Game, GameState, get_game


class Evaluator(Protocol):
    positions: int
    batches: int

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, A) priors over legal moves and (N,) values from each side to move's view."""
        ...

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]: ...


class _FromStates:
    """`evaluate(states)` through the batch form, so each evaluator has one code path."""

    game: Game

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        return self.evaluate_batch(self.game.state_words(states))  # type: ignore[attr-defined]


def uniform_priors(game: Game, words: np.ndarray) -> np.ndarray:
    legal = game.words_legal_masks(words).astype(np.float64)
    return legal / np.maximum(legal.sum(axis=1, keepdims=True), 1.0)


class NetworkEvaluator(_FromStates):
    """Evaluates a batch with one forward pass of a policy/value network.

    Counts `positions` and `batches` evaluated, so callers can report throughput. The network
    may live on a GPU (`selfplay.device`); `predict` moves each batch there and back. The
    game makes the batch's planes and legal masks from the words at once: one state at a time
    they cost ~13 us a leaf, a quarter of a simulation where the network runs on a GPU.
    """

    def __init__(self, net: PolicyValueNet, game: Game) -> None:
        self.net = net.eval()
        self.game = game
        self.positions = 0
        self.batches = 0

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(words)
        self.batches += 1
        return predict(self.net, self.game.words_planes(words), self.game.words_legal_masks(words))


class UniformEvaluator(_FromStates):
    """Uniform prior over legal moves and value 0: search guided by terminal states only."""

    def __init__(self, game: Game | None = None) -> None:
        self.game = game or get_game("connect4")
        self.positions = 0
        self.batches = 0

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(words)
        self.batches += 1
        return uniform_priors(self.game, words), np.zeros(len(words), dtype=np.float64)


class RolloutEvaluator(_FromStates):
    """Uniform prior; value = mean result of `rollouts_per_leaf` uniformly random games."""

    def __init__(self, game: Game, rollouts_per_leaf: int = 16, rng: np.random.Generator | None = None) -> None:
        if rollouts_per_leaf < 1:
            raise ValueError(f"rollouts_per_leaf must be >= 1, got {rollouts_per_leaf}")
        if game.name != "connect4":
            raise ValueError(f"random playouts are written for connect4's bitboards, not {game.name!r}")
        self.game = game
        self.rollouts_per_leaf = rollouts_per_leaf
        self.rng = rng if rng is not None else np.random.default_rng()
        self.positions = 0
        self.batches = 0

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from app.games.connect4_playouts import playout_values

        self.positions += len(words)
        self.batches += 1
        return uniform_priors(self.game, words), playout_values(words, self.rollouts_per_leaf, self.rng)
