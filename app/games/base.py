"""The small game interface every layer above `games` talks to.

A second workload will plug in beside Connect Four, so search, self-play, training and the
daemons see only this: an immutable state, integer actions, planes from the side to move's
view, and symmetries for augmentation. Nothing above this package imports a concrete game
except through `app.games.get_game`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np


class GameError(Exception):
    """Base class of every rule error a game raises."""


class IllegalMoveError(GameError, ValueError):
    """A move that the rules forbid in the given state; names the move and the state."""

    def __init__(self, move: object, state: str, reason: str) -> None:
        super().__init__(f"illegal move {move!r} in position {state!r}: {reason}")
        self.move = move
        self.state = state
        self.reason = reason


class ParseError(GameError, ValueError):
    """A position text that does not describe a legal sequence of moves."""


def result_scale(plies: int, max_plies: int, length_discount: float) -> float:
    """What a decided game that lasted `plies` moves is worth, 1 - d * plies / max_plies.

    With d = 0 every win is +1 and every loss -1, and a search is indifferent between a quick
    win and a slow one. A solver's scores (and the exact-move benchmark) rank a quicker win
    above a slower one and a later loss above an earlier one; d > 0 gives the search and the
    value targets the same order, at the cost of shrinking late results toward a draw's 0.
    """
    return 1.0 - length_discount * plies / max_plies


class GameState(ABC):
    """An immutable position. `play` returns a new state; nothing mutates in place."""

    @property
    @abstractmethod
    def to_move(self) -> int:
        """0 for the first player, 1 for the second."""

    @property
    @abstractmethod
    def ply(self) -> int:
        """Number of moves played so far."""

    @abstractmethod
    def legal_moves(self) -> list[int]:
        """Legal actions in increasing order; empty when terminal."""

    @abstractmethod
    def legal_mask(self) -> np.ndarray:
        """Boolean vector of length `num_actions`; all False when terminal."""

    @abstractmethod
    def play(self, action: int) -> "GameState":
        """The state after `action`; raises IllegalMoveError naming the move."""

    @property
    @abstractmethod
    def is_terminal(self) -> bool: ...

    @property
    @abstractmethod
    def winner(self) -> int | None:
        """0 or 1 when a player has won, None for a draw or an unfinished game."""

    @property
    @abstractmethod
    def max_plies(self) -> int:
        """The most moves any game can last: the scale of `terminal_value`'s length discount."""

    def terminal_value(self, length_discount: float = 0.0) -> float:
        """Result from the side to move's view (+1 win, 0 draw, -1 loss) of a terminal state,
        scaled by `result_scale(ply, max_plies, length_discount)`."""
        if not self.is_terminal:
            raise GameError("terminal_value of a non-terminal state")
        if self.winner is None:
            return 0.0
        sign = 1.0 if self.winner == self.to_move else -1.0
        return sign * result_scale(self.ply, self.max_plies, length_discount)

    def winning_moves(self) -> list[int]:
        """Legal moves that win on the spot for the side to move.

        A search asks this of every node it creates (`SearchConfig.threat_check`), so a game
        with a cheap test (Connect Four's bitboard) overrides this generic one, which plays
        every move.
        """
        mover = self.to_move
        wins = []
        for action in self.legal_moves():
            after = self.play(action)
            if after.is_terminal and after.winner == mover:
                wins.append(action)
        return wins

    def safe_moves(self) -> list[int]:
        """Legal moves after which the opponent has no winning move on the spot.

        Any other move loses on the next ply, the quickest loss there is, so a search that
        drops them never drops the best move (unless every move is unsafe: then all lose alike).
        """
        return [action for action in self.legal_moves() if not self.play(action).winning_moves()]

    def threat_outlook(self) -> tuple[list[int], list[int]]:
        """(winning_moves(), safe_moves()) in one call, for games that find both in one pass."""
        return self.winning_moves(), self.safe_moves()

    @abstractmethod
    def planes(self) -> np.ndarray:
        """Network input, float32 of shape `Game.plane_shape`, from the side to move's view."""

    @abstractmethod
    def key(self) -> object:
        """A hashable that identifies the position (not the move order)."""

    @abstractmethod
    def to_text(self) -> str:
        """The move sequence in the game's notation; `Game.parse` reads it back."""


class Game(ABC):
    """A game's static description: sizes, the start, parsing, symmetries."""

    name: str
    num_actions: int
    plane_shape: tuple[int, int, int]

    @abstractmethod
    def initial_state(self) -> GameState: ...

    @abstractmethod
    def parse(self, text: str) -> GameState:
        """State after the moves in `text`; raises ParseError (a bad character or move)."""

    @abstractmethod
    def action_to_text(self, action: int) -> str: ...

    @abstractmethod
    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
        """Every symmetric image of (planes, policy), the identity first: of one sample, or
        of a batch of them (a leading axis on both, as export passes a game's samples)."""

    # -- the batch form: many positions as one array (the search and the evaluators use it) --

    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        """The positions of `states` as the game's batch form: a uint64 array (N, words), the
        input of `words_planes`, `words_legal_masks` and the array search."""
        raise NotImplementedError(f"{self.name} has no batch form")

    def words_planes(self, words: np.ndarray) -> np.ndarray:
        """The network input of a batch (N, *plane_shape) float32, as `GameState.planes`."""
        raise NotImplementedError(f"{self.name} has no batch form")

    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        """(N, num_actions) bool of a batch, as `GameState.legal_mask` (all False when over)."""
        raise NotImplementedError(f"{self.name} has no batch form")

    def stacked_planes(self, states: Sequence[GameState]) -> np.ndarray:
        """The `planes` of many states, stacked (N, *plane_shape). A game with a batch form
        makes them in one batch: export calls this for every position of every game in its
        window."""
        return np.stack([state.planes() for state in states])

    def stacked_legal_masks(self, states: Sequence[GameState]) -> np.ndarray:
        """The `legal_mask` of many states, stacked (N, num_actions); as `stacked_planes`."""
        return np.stack([state.legal_mask() for state in states])
