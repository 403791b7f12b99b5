"""Connect Four on a bitboard, 7 columns x 6 rows.

The layout is Pascal Pons': column c occupies bits c*7 .. c*7+5 (bottom to top) and bit c*7+6
is a sentinel that keeps columns apart, so a four-in-a-row is found with four shifts. A state
keeps the stones of the side to move (`position`) and all stones (`mask`), plus the move
string, which is also the notation of ../shared/benchmarks/connect4 (digits 1-7).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from app.games import connect4_arrays
from app.games.connect4_bits import (  # noqa: F401 - winning_cells, playable_cells: this module's API too
    _BOARD, _BOTTOM_ROW, _column_mask, _columns, playable_cells, winning_cells,
)
from app.games.base import Game, GameState, IllegalMoveError, ParseError

WIDTH = connect4_arrays.WIDTH
HEIGHT = connect4_arrays.HEIGHT
_COLUMN_BITS = HEIGHT + 1
_BOTTOM = [1 << (c * _COLUMN_BITS) for c in range(WIDTH)]
_TOP = [1 << (HEIGHT - 1 + c * _COLUMN_BITS) for c in range(WIDTH)]
_CELL_BITS = np.array(
    [[c * _COLUMN_BITS + r for c in range(WIDTH)] for r in range(HEIGHT)], dtype=np.int64
)  # [row, col] -> bit index, row 0 at the bottom


def has_four(stones: int) -> bool:
    """True when `stones` (one player's bitboard) holds four in a row in any direction."""
    for shift in (_COLUMN_BITS, HEIGHT, _COLUMN_BITS + 1, 1):
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (2 * shift)):
            return True
    return False


def bitboard_to_grid(stones: int) -> np.ndarray:
    """(HEIGHT, WIDTH) 0/1 float32 array of a bitboard, row 0 at the bottom."""
    bits = np.unpackbits(
        np.frombuffer(stones.to_bytes(8, "little"), dtype=np.uint8), bitorder="little"
    )
    return bits[_CELL_BITS].astype(np.float32)


class Connect4State(GameState):
    __slots__ = ("position", "mask", "moves", "_won")

    def __init__(self, position: int = 0, mask: int = 0, moves: str = "", won: bool = False):
        self.position = position
        self.mask = mask
        self.moves = moves
        self._won = won

    def __repr__(self) -> str:
        return f"Connect4State({self.moves!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Connect4State)
            and self.position == other.position
            and self.mask == other.mask
        )

    def __hash__(self) -> int:
        return hash((self.position, self.mask))

    @property
    def to_move(self) -> int:
        return len(self.moves) & 1

    @property
    def ply(self) -> int:
        return len(self.moves)

    @property
    def max_plies(self) -> int:
        return WIDTH * HEIGHT

    @property
    def is_terminal(self) -> bool:
        return self._won or len(self.moves) == WIDTH * HEIGHT

    @property
    def winner(self) -> int | None:
        # The player who just moved made the four: the one not to move now.
        return 1 - self.to_move if self._won else None

    def legal_moves(self) -> list[int]:
        if self.is_terminal:
            return []
        mask = self.mask
        return [c for c in range(WIDTH) if not (mask & _TOP[c])]

    def legal_mask(self) -> np.ndarray:
        out = np.zeros(WIDTH, dtype=bool)
        out[self.legal_moves()] = True
        return out

    def is_winning_move(self, col: int) -> bool:
        """Whether playing `col` (assumed legal) makes four for the side to move."""
        return has_four(self.position | self._new_stone(col))

    def winning_moves(self) -> list[int]:
        if self.is_terminal:
            return []
        return _columns(winning_cells(self.position, self.mask) & playable_cells(self.mask))

    def safe_moves(self) -> list[int]:
        return self.threat_outlook()[1]

    def threat_outlook(self) -> tuple[list[int], list[int]]:
        """Both at once on the bitboard. The safe moves are Pons' non-losing moves (and any
        winning move): a forced block if the opponent threatens one cell (none if two), never
        a stone just below a cell where the opponent would make four."""
        if self.is_terminal:
            return [], []
        playable = playable_cells(self.mask)
        wins = winning_cells(self.position, self.mask) & playable  # they end the game: safe
        threats = winning_cells(self.position ^ self.mask, self.mask)
        forced = playable & threats
        if forced:
            if forced & (forced - 1):  # two cells to block at once: every other move loses
                return _columns(wins), _columns(wins)
            playable = forced
        return _columns(wins), _columns(wins | (playable & ~(threats >> 1)))

    def _new_stone(self, col: int) -> int:
        return (self.mask + _BOTTOM[col]) & _column_mask(col)

    def play(self, action: int) -> "Connect4State":
        if self.is_terminal:
            raise IllegalMoveError(action, self.moves, "the game is over")
        if not isinstance(action, (int, np.integer)) or not 0 <= action < WIDTH:
            raise IllegalMoveError(action, self.moves, f"columns are 0..{WIDTH - 1}")
        action = int(action)
        if self.mask & _TOP[action]:
            raise IllegalMoveError(action, self.moves, f"column {action + 1} is full")
        stone = self._new_stone(action)
        mover = self.position | stone
        mask = self.mask | stone
        return Connect4State(mover ^ mask, mask, self.moves + str(action + 1), has_four(mover))

    def planes(self) -> np.ndarray:
        """Own stones, opponent stones, and a plane of ones (lets convolutions see the edge)."""
        out = np.empty((3, HEIGHT, WIDTH), dtype=np.float32)
        out[0] = bitboard_to_grid(self.position)
        out[1] = bitboard_to_grid(self.position ^ self.mask)
        out[2] = 1.0
        return out

    def key(self) -> int:
        # position + mask is unique per position (Pons): it sets the bit above each column.
        return self.position + self.mask

    def to_text(self) -> str:
        return self.moves


class Connect4(Game):
    name = "connect4"
    num_actions = WIDTH
    plane_shape = (3, HEIGHT, WIDTH)
    max_plies = WIDTH * HEIGHT
    words = connect4_arrays.WORDS
    rules_module = "app.games.connect4_rules"
    num_players = 2
    # Pons' solver-scored positions, beside the repository (../shared/...): the solved panel
    scored_positions = "shared/benchmarks/connect4/move_scores.txt"

    def initial_state(self) -> Connect4State:
        return Connect4State()

    def parse(self, text: str) -> Connect4State:
        """State after a Pons move string such as '4453'; whitespace around it is ignored."""
        state = Connect4State()
        for i, ch in enumerate(text.strip()):
            if ch < "1" or ch > str(WIDTH):
                raise ParseError(f"bad character {ch!r} at index {i} of {text!r}: moves are digits 1-{WIDTH}")
            try:
                state = state.play(int(ch) - 1)
            except IllegalMoveError as exc:
                raise ParseError(f"move {i + 1} of {text!r} ({ch}) is illegal: {exc.reason}") from exc
        return state

    def action_to_text(self, action: int) -> str:
        return str(action + 1)

    def symmetries(
        self, planes: np.ndarray, policy: np.ndarray
    ) -> Sequence[tuple[np.ndarray, np.ndarray]]:
        """Identity and the left-right mirror: the only symmetry of the board."""
        return [(planes, policy), (planes[..., ::-1].copy(), policy[..., ::-1].copy())]

    def heuristic_scores(self, state: GameState, depth: int) -> dict[int, float]:
        from app.games.connect4_heuristic import connect4_move_scores

        return connect4_move_scores(state.position, state.mask, depth)  # type: ignore[attr-defined]

    def playout_values(self, words: np.ndarray, rollouts: int, rng: np.random.Generator) -> np.ndarray:
        from app.games.connect4_playouts import playout_values

        return playout_values(words, rollouts, rng)

    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        return connect4_arrays.words_of(states)

    def words_planes(self, words: np.ndarray) -> np.ndarray:
        return connect4_arrays.planes(words)

    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        return connect4_arrays.legal_masks(words)

    def stacked_planes(self, states: Sequence[GameState]) -> np.ndarray:
        """Every state's `planes` from one unpacking of all their bitboards."""
        return connect4_arrays.planes(connect4_arrays.words_of(states))

    def stacked_legal_masks(self, states: Sequence[GameState]) -> np.ndarray:
        return connect4_arrays.legal_masks(connect4_arrays.words_of(states))
