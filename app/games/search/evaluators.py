"""Leaf evaluators for the search: a network, a uniform prior, random rollouts.

Every evaluator answers one batch at a time, because the search gathers one leaf from each
of many concurrent games and asks once, with the positions in the game's batch form (a
uint64 array of words, `Game.state_words`), so its input is made by array operations:

    priors, values = evaluator.evaluate_batch(words)   # (N, A) over legal moves, (N,) side to move
                                                       # ((N, value_size) for an N-player game)
    priors, values = evaluator.evaluate(states)        # the same for GameState objects

Priors are zero on illegal moves and sum to 1 over legal ones; values are in [-1, 1] from
the view of the side to move in each state. Positions passed in are never finished (the
search values those exactly itself).

- `NetworkEvaluator(net, game)`: one batched forward pass (`app.games.search.model.predict`), its
  input made by the game from the words (`Game.words_planes`, `Game.words_legal_masks`).
- `UniformEvaluator(game)`: uniform prior, value 0 -- the bootstrap before any model exists;
  the search then learns only from terminal states it reaches.
- `RolloutEvaluator(game, rollouts_per_leaf, rng)`: uniform prior, value = mean of random
  playouts: the game's own (`Game.playout_values`) or playout_kernel.py's, compiled over the
  game's node rules.
- `SharedNetworkClient` (app/games/search/network_server.py): the same answers from a network served
  to several search processes at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

from app.games import Game, GameState

if TYPE_CHECKING:  # torch loads with the first network, not with the search (a node that only
    # gossips, or plays rollout players, never pays for it)
    from app.games.search.model import PolicyValueNet


class Evaluator(Protocol):
    positions: int
    batches: int

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(N, A) priors over legal moves and (N,) values from each side to move's view."""
        ...

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]: ...


class _FromStates:
    """`evaluate(states)` through the batch form, so each evaluator has one code path; and the
    positions and batches it was asked, counted once here for every evaluator."""

    game: Game
    positions: int = 0
    batches: int = 0

    def evaluate(self, states: Sequence[GameState]) -> tuple[np.ndarray, np.ndarray]:
        return self.evaluate_batch(self.game.state_words(states))  # type: ignore[attr-defined]

    def _count(self, words: np.ndarray) -> None:
        self.positions += len(words)
        self.batches += 1


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
        from app.games.search.model import predict  # a net exists, so torch is loaded already

        self.net = net.eval()
        self.game = game
        self._predict = predict

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._count(words)
        return self._predict(self.net, self.game.words_planes(words), self.game.words_legal_masks(words))


class UniformEvaluator(_FromStates):
    """Uniform prior over legal moves and value 0: search guided by terminal states only."""

    def __init__(self, game: Game) -> None:
        self.game = game

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._count(words)
        return uniform_priors(self.game, words), zero_values(self.game, len(words))


def zero_values(game: Game, n: int) -> np.ndarray:
    """Value 0 for every seat, shaped as the game's network answers."""
    return np.zeros(n if game.value_size == 1 else (n, game.value_size), dtype=np.float64)


class RolloutEvaluator(_FromStates):
    """Uniform prior; value = mean result of `rollouts_per_leaf` uniformly random games."""

    def __init__(self, game: Game, rollouts_per_leaf: int = 16, rng: np.random.Generator | None = None) -> None:
        if rollouts_per_leaf < 1:
            raise ValueError(f"rollouts_per_leaf must be >= 1, got {rollouts_per_leaf}")
        self.game = game
        self._kernel = None
        if type(game).playout_values is Game.playout_values:  # no playouts of its own: the compiled ones
            from app.games.search.kernel_build import playouts_for

            self._kernel = playouts_for(game)
            if not self._kernel.HAS_PLY_OF:
                raise ValueError(f"{game.name}: random playouts need Game.playout_values or the rules' ply_of")
        self.rollouts_per_leaf = rollouts_per_leaf
        self.rng = rng if rng is not None else np.random.default_rng()

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self._count(words)
        if self._kernel is None:
            values = self.game.playout_values(words, self.rollouts_per_leaf, self.rng)
        else:
            out = np.zeros((len(words), self.game.value_size))
            self._kernel.playout_values(np.ascontiguousarray(words), self.rollouts_per_leaf,
                                        int(self.rng.integers(2**31)), self.game.value_size, out)
            values = out[:, 0] if self.game.value_size == 1 else out
        return uniform_priors(self.game, words), values
