"""A game for three players: the m,n,k game on a 6x6 board, four in a row to win.

Seats 0, 1, 2 take turns in that order, each putting a stone of their own on any empty cell.
The first to have four of their stones in a line (a row, a column or a diagonal) wins at once;
a full board with no line is a draw. With two opponents each threat must be blocked by the
seat whose turn comes first, and a seat can often only choose which opponent to stop, so
the game rewards building double threats and timing blocks (and has kingmaking, as every
three-player game does).

Returns are zero-sum: the winner +1, each other seat -1/2, a draw 0 for all. A seat's score
in the benchmark's sense (1 a win, 1/3 a draw, 0 a loss) is (return + 1/2) / (3/2).

Notation: cells `a1` .. `f6` (column letter, row number; action r * 6 + c), a game's text is
its moves separated by spaces. This object form keeps a grid and scans lines; `mnk3_arrays`
(the compiled form the search uses) works on bitboards, and each checks the other.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from app.games.base import Game, GameError, GameState, IllegalMoveError, ParseError
from app.games.square_board import cell_symmetries

SIZE = 6
CELLS = SIZE * SIZE
LINE = 4
PLAYERS = 3
EMPTY = -1
_LETTERS = "abcdef"
_WIN, _LOSS = 1.0, -0.5


def cell_name(cell: int) -> str:
    return f"{_LETTERS[cell % SIZE]}{cell // SIZE + 1}"


def makes_line(cells: tuple[int, ...], cell: int) -> bool:
    """Whether the stone on `cell` is part of LINE in a row of its owner's stones."""
    seat, r0, c0 = cells[cell], cell // SIZE, cell % SIZE
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        run = 1
        for sign in (1, -1):
            r, c = r0 + sign * dr, c0 + sign * dc
            while 0 <= r < SIZE and 0 <= c < SIZE and cells[r * SIZE + c] == seat:
                run += 1
                r, c = r + sign * dr, c + sign * dc
        if run >= LINE:
            return True
    return False


class MNK3State(GameState):
    """A position: each cell's owner (EMPTY or a seat) and the moves that led here."""

    __slots__ = ("cells", "moves", "_winner")

    def __init__(self, cells: tuple[int, ...], moves: tuple[int, ...], winner: int | None) -> None:
        self.cells, self.moves, self._winner = cells, moves, winner

    def __repr__(self) -> str:
        return f"MNK3State({self.to_text()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MNK3State) and self.cells == other.cells

    def __hash__(self) -> int:
        return hash(self.cells)

    @property
    def to_move(self) -> int:
        return len(self.moves) % PLAYERS

    @property
    def ply(self) -> int:
        return len(self.moves)

    @property
    def max_plies(self) -> int:
        return CELLS

    @property
    def is_terminal(self) -> bool:
        return self._winner is not None or len(self.moves) == CELLS

    @property
    def winner(self) -> int | None:
        return self._winner

    def returns(self) -> np.ndarray:
        """Each seat's result: the winner +1, the others -1/2; a draw 0 for all."""
        if not self.is_terminal:
            raise GameError("returns of an unfinished game")
        if self._winner is None:
            return np.zeros(PLAYERS)
        out = np.full(PLAYERS, _LOSS)
        out[self._winner] = _WIN
        return out

    def legal_moves(self) -> list[int]:
        if self.is_terminal:
            return []
        return [c for c in range(CELLS) if self.cells[c] == EMPTY]

    def legal_mask(self) -> np.ndarray:
        out = np.zeros(CELLS, dtype=bool)
        out[self.legal_moves()] = True
        return out

    def play(self, action: int) -> "MNK3State":
        where = self.to_text() or "start"
        if self.is_terminal:
            raise IllegalMoveError(action, where, "the game is over")
        if not isinstance(action, (int, np.integer)) or not 0 <= action < CELLS:
            raise IllegalMoveError(action, where, f"cells are 0..{CELLS - 1}")
        action = int(action)
        if self.cells[action] != EMPTY:
            raise IllegalMoveError(action, where, f"{cell_name(action)} is taken")
        cells = list(self.cells)
        cells[action] = self.to_move
        cells = tuple(cells)
        return MNK3State(cells, self.moves + (action,), self.to_move if makes_line(cells, action) else None)

    def planes(self) -> np.ndarray:
        """The stones of the side to move, of the next seat, of the one after, and ones."""
        grid = np.array(self.cells, dtype=np.int64).reshape(SIZE, SIZE)
        out = np.ones((PLAYERS + 1, SIZE, SIZE), dtype=np.float32)
        for k in range(PLAYERS):
            out[k] = grid == (self.to_move + k) % PLAYERS
        return out

    def key(self) -> tuple[int, ...]:
        return self.cells

    def to_text(self) -> str:
        return " ".join(cell_name(a) for a in self.moves)

    def board_text(self) -> str:
        """Rows of `a`, `b`, `c` (seats 0, 1, 2) and `.`, row 1 first."""
        return "\n".join("".join(".abc"[self.cells[r * SIZE + c] + 1] for c in range(SIZE)) for r in range(SIZE))


class MNK3(Game):
    """Three players, 6x6, four in a row."""

    name = "mnk3"
    num_players = PLAYERS
    num_actions = CELLS
    plane_shape = (PLAYERS + 1, SIZE, SIZE)
    max_plies = CELLS
    words = 3
    rules_module = "app.games.mnk3_arrays"

    def __init__(self) -> None:
        self.cell_perms = cell_symmetries(SIZE)

    def initial_state(self) -> MNK3State:
        return MNK3State((EMPTY,) * CELLS, (), None)

    def cell_of(self, text: str) -> int:
        t = text.strip().lower()
        if len(t) != 2 or t[0] not in _LETTERS or t[1] not in "123456":
            raise ParseError(f"{text!r} is no cell of the 6x6 board (a1..f6)")
        return (int(t[1]) - 1) * SIZE + _LETTERS.index(t[0])

    def parse(self, text: str) -> MNK3State:
        state = self.initial_state()
        for token in text.replace(",", " ").split():
            try:
                state = state.play(self.cell_of(token))
            except IllegalMoveError as err:
                raise ParseError(f"{text!r}: {err}") from err
        return state

    def action_to_text(self, action: int) -> str:
        return cell_name(action)

    def symmetry_permutations(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The eight symmetries of the square (actions are the cells, so one permutation
        serves both): image cell j takes the original's cell at the inverse of `cell_perms[k]`."""
        return [(np.argsort(cells), np.argsort(cells)) for cells in self.cell_perms]

    # -- the batch form (app/games/mnk3_arrays.py) --

    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        from app.games import mnk3_arrays
        return mnk3_arrays.words_of(states)

    def words_planes(self, words: np.ndarray) -> np.ndarray:
        from app.games import mnk3_arrays
        return mnk3_arrays.planes(words)

    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        from app.games import mnk3_arrays
        return mnk3_arrays.legal_masks(words)

