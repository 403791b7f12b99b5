"""The game interface every layer above `games` talks to: any board game, N players.

A game is two things, and the search, self-play, training and the daemons see only these:

1. **Objects** (this module): `Game`, a game's fixed facts and its parsing, notation and
   symmetries; `GameState`, an immutable position with its rules one call at a time
   (`play`, `legal_moves`, `is_terminal`, `returns`, `planes`, ...). Self-play records,
   export, the gauntlet and `app.analyze` use these.
2. **The array form** (`app/games/array_rules.py` says the contract in full): a position as
   `Game.words` uint64 words; the batch's network input and legal masks as numpy
   (`Game.words_planes`, `Game.words_legal_masks`); and the per-node rules as numba-compiled
   functions in one module (`Game.rules_module`) that the array search
   (app/games/search/search_kernel.py) is compiled against, once per game, cached on disk.

Players and values. `num_players` seats, numbered 0..N-1; `GameState.to_move` is the seat
that acts. At the end `GameState.returns()` gives each seat's result, a float vector of
length N (Connect Four: +1 / -1 / 0; a three-seat game e.g. +1 for the winner and -0.5 for
the others). A search node chooses by its mover's entry (max^n); a game with
`two_player_zero_sum` (N = 2, returns always summing to 0) is searched as negamax, its
network has one value output (the mover's) and the MCTS-solver proves positions; any other
game's network has N value outputs, entry k for seat (to_move + k) % N, and proofs are off
unless the game says its results allow them (`solver_proofs`).

Nothing above this package imports a concrete game except through `app.games.get_game`
(a registered name or a user's `"package.module:Class"`).
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
    """An immutable position. `play` returns a new state; nothing mutates in place.

    A game implements `to_move`, `ply`, `legal_moves`, `legal_mask`, `play`, `is_terminal`,
    `returns` (or, for a two-player game, `winner`: each defaults to the other), `max_plies`,
    `planes`, `key` and `to_text`."""

    @property
    @abstractmethod
    def to_move(self) -> int:
        """The seat that acts now, 0..num_players-1 (0 for the first player)."""

    @property
    @abstractmethod
    def ply(self) -> int:
        """Number of moves (passes included) played so far."""

    @abstractmethod
    def legal_moves(self) -> list[int]:
        """Legal actions in increasing order; empty when terminal. A game whose player may
        have to pass makes the pass an action of its own (the search needs a move a ply)."""

    @abstractmethod
    def legal_mask(self) -> np.ndarray:
        """Boolean vector of length `num_actions`; all False when terminal."""

    @abstractmethod
    def play(self, action: int) -> "GameState":
        """The state after `action`; raises IllegalMoveError naming the move."""

    @property
    @abstractmethod
    def is_terminal(self) -> bool: ...

    def returns(self) -> np.ndarray:
        """Each seat's result of a finished game, float64 of shape (num_players,), seat i at
        index i: e.g. (+1, -1) a first-player win, (0, 0) a draw. Raises GameError before the
        end. The default reads `winner` (two seats: +1 / -1, a draw 0); an N-player game
        overrides this."""
        if not self.is_terminal:
            raise GameError("returns() of a non-terminal state")
        out = np.zeros(2, dtype=np.float64)
        if self.winner is not None:
            out[:] = -1.0
            out[self.winner] = 1.0
        return out

    @property
    def winner(self) -> int | None:
        """The seat with the strictly highest return of a finished game, None for a tie (a
        draw) or an unfinished game. Two-player games may override it (and not `returns`)."""
        if not self.is_terminal:
            return None
        r = self.returns()
        top = np.flatnonzero(r == r.max())
        return int(top[0]) if len(top) == 1 else None

    def scaled_returns(self, length_discount: float = 0.0) -> np.ndarray:
        """`returns()` times `result_scale(ply, max_plies, length_discount)`: what the search
        and the value targets use, so a quicker win is worth more."""
        return self.returns() * result_scale(self.ply, self.max_plies, length_discount)

    @property
    @abstractmethod
    def max_plies(self) -> int:
        """The most moves any game can last: the scale of `terminal_value`'s length discount."""

    def terminal_value(self, length_discount: float = 0.0) -> float:
        """Result from the side to move's view of a terminal state (+1 win, 0 draw, -1 loss in
        a two-player game), scaled by `result_scale(ply, max_plies, length_discount)`."""
        if not self.is_terminal:
            raise GameError("terminal_value of a non-terminal state")
        return float(self.scaled_returns(length_discount)[self.to_move])

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
    """A game's fixed facts, its start, notation, symmetries and array form.

    Required (class attributes or properties): `name`, `num_actions`, `plane_shape`
    (channels, height, width), `max_plies`, `words` (uint64 words of a position),
    `rules_module` (import path of the compiled node rules, app/games/array_rules.py);
    methods `initial_state`, `parse`, `action_to_text`, `state_words`, `words_planes`,
    `words_legal_masks`. Defaults a game may override: `num_players` 2,
    `two_player_zero_sum` (True when N = 2), `solver_proofs`, `symmetry_permutations`
    (identity only), `action_from_text`, `heuristic_scores`, `playout_values`, `scored_positions`
    (none). `app.games.checks.check_game` verifies all of it at start.
    """

    name: str
    num_actions: int
    plane_shape: tuple[int, int, int]
    max_plies: int
    words: int
    rules_module: str
    num_players: int = 2
    # a file of solver-scored positions (app/games/train/solved_eval.py's format), relative to the
    # directory that holds the repository; None: no solved-position panel for this game
    scored_positions: str | None = None

    @property
    def two_player_zero_sum(self) -> bool:
        """True when the game has two seats whose returns always sum to zero: searched as
        negamax, one value output, proofs on. Override to False for a two-seat game whose
        returns do not cancel."""
        return self.num_players == 2

    @property
    def value_size(self) -> int:
        """Outputs of the network's value head: 1 (the mover's value) for a two-player
        zero-sum game, else N (entry k for seat (to_move + k) % N)."""
        return 1 if self.two_player_zero_sum else self.num_players

    @property
    def solver_proofs(self) -> bool:
        """Whether the search's MCTS-solver may prove positions: on for two-player zero-sum
        games (with the rules' threat hook), off for any other unless the game turns it on.
        An N > 2 game may when its results allow them: no seat's return exceeds a win's (+1),
        and a win on the spot gives every other seat one same result, so a child that wins at
        once is its mover's best and its returns are the node's; a node whose children are all
        proven takes the best for its mover (ties by move order, max^n's usual rule). A game
        of two seats whose returns do not cancel cannot (app.games.checks refuses it)."""
        return self.two_player_zero_sum

    @abstractmethod
    def initial_state(self) -> GameState: ...

    @abstractmethod
    def parse(self, text: str) -> GameState:
        """State after the moves in `text`; raises ParseError (a bad character or move)."""

    @abstractmethod
    def action_to_text(self, action: int) -> str:
        """The game's own notation of one move (`to_text` joins these)."""

    def action_from_text(self, text: str) -> int:
        """The action a move's notation names (inverse of `action_to_text`); ParseError."""
        for action in range(self.num_actions):
            if self.action_to_text(action) == text.strip():
                return action
        raise ParseError(f"{text!r} is no move of {self.name}")

    def heuristic_scores(self, state: GameState, depth: int) -> dict[int, float] | None:
        """A hand-written player's score of each legal move of `state` for its mover (higher
        is better; the gauntlet's middle rung plays the best, ties to the centre), searching
        `depth` plies; None (the default): app/games/search/heuristic.py's search over the state
        interface with terminal results only."""
        return None

    def playout_values(self, words: np.ndarray, rollouts: int, rng: np.random.Generator) -> np.ndarray | None:
        """Mean raw result of `rollouts` uniformly random games from each position of a batch,
        shaped like the network's values ((B,) for value_size 1, else (B, N) from each mover
        on); None (the default): the search kernel's compiled playouts over the node rules
        (which need the rules' `ply_of`)."""
        return None

    def symmetry_permutations(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The board's symmetries as index permutations, the identity first: each a pair
        (cells, actions), `cells` of length height*width (image cell i takes original cell
        cells[i], row-major) and `actions` of length num_actions (image action j takes
        original action actions[j]). Export augments every sample with each of them."""
        h, w = self.plane_shape[1:]
        return [(np.arange(h * w), np.arange(self.num_actions))]

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
        """Every symmetric image of (planes, policy), the identity first: of one sample, or
        of a batch of them (a leading axis on both, as export passes a game's samples).
        Built from `symmetry_permutations`."""
        c, h, w = self.plane_shape
        out = []
        for cells, actions in self.symmetry_permutations():
            flat = planes.reshape(*planes.shape[:-2], h * w)
            out.append((flat[..., cells].reshape(planes.shape), policy[..., actions]))
        return out

    # -- the batch form: many positions as one array (the search and the evaluators use it) --

    @abstractmethod
    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        """The positions of `states` as the game's batch form: a uint64 array (B, words), the
        input of `words_planes`, `words_legal_masks` and the array search. The words must
        say the position fully, the side to move included (the ply is kept beside them)."""

    @abstractmethod
    def words_planes(self, words: np.ndarray) -> np.ndarray:
        """The network input of a batch (B, *plane_shape) float32, as `GameState.planes`."""

    @abstractmethod
    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        """(B, num_actions) bool of a batch, as `GameState.legal_mask` (all False when over)."""

    def stacked_planes(self, states: Sequence[GameState]) -> np.ndarray:
        """The `planes` of many states, stacked (B, *plane_shape). A game with a batch form
        makes them in one batch: export calls this for every position of every game in its
        window."""
        return self.words_planes(self.state_words(states))

    def stacked_legal_masks(self, states: Sequence[GameState]) -> np.ndarray:
        """The `legal_mask` of many states, stacked (B, num_actions); as `stacked_planes`."""
        return self.words_legal_masks(self.state_words(states))
