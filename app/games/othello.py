"""Othello (Reversi) on a small square board, 6x6 by default: moves that flip earlier stones,
and passes.

Rules as the World Othello Federation's, on a size x size board: the four centre cells start
with two stones each, diagonally (white on c3 and d4, black on d3 and c4 for 6x6), black moves
first. A move puts a stone on an empty cell that brackets, in at least one of the eight
directions, a contiguous line of the opponent's stones ending in one of the mover's own; every
bracketed line flips. A player with no such move must pass (the action `size*size`, legal only
then); the game ends when neither player can move (a full board is a special case), and the
player with more stones wins (the disc count; empty cells are not counted here, see
`othello_solver` for the scored margin).

Notation: a cell is its column letter and row number, `a1` .. `f6` (a1 is bit 0, row 1 the
first `size` bits), a pass is `pass`; a game's text is its moves separated by spaces. This
object form is written with Python integers and no tables shared with `othello_arrays`, the
compiled form the search uses: each checks the other (tests/test_othello_arrays.py), and the
rules here are checked against 8x8 Othello's published move-path counts
(tests/test_othello.py), so the module takes any even size from 4 to 8.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Sequence

import numpy as np

from app.games.base import Game, GameError, GameState, IllegalMoveError, ParseError
from app.games.square_board import cell_symmetries

BLACK, WHITE = 0, 1
_LETTERS = "abcdefgh"


@lru_cache(maxsize=None)
def _geometry(size: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(board mask, ((shift, mask after the shift) for the eight directions)) of a board."""
    board = (1 << (size * size)) - 1
    not_first = sum(1 << (r * size + c) for r in range(size) for c in range(1, size))
    not_last = sum(1 << (r * size + c) for r in range(size) for c in range(size - 1))
    directions = []
    for dr in (-1, 0, 1):
        for dc in (-1, 0, 1):
            if dr == dc == 0:
                continue
            # Moving one column right must not wrap from the last column into the first.
            keep = board & (not_first if dc == 1 else not_last if dc == -1 else board)
            directions.append((dr * size + dc, keep))
    return board, tuple(directions)


def _shift(bits: int, shift: int, keep: int) -> int:
    return ((bits << shift) if shift > 0 else (bits >> -shift)) & keep


def legal_cells(own: int, opp: int, size: int) -> int:
    """The cells where the side owning `own` may put a stone, as a bitboard."""
    board, directions = _geometry(size)
    empty = board & ~(own | opp)
    moves = 0
    for shift, keep in directions:
        line = _shift(own, shift, keep) & opp
        for _ in range(size - 3):  # a bracketed line holds at most size - 2 stones
            line |= _shift(line, shift, keep) & opp
        moves |= _shift(line, shift, keep) & empty
    return moves


def flipped_by(own: int, opp: int, cell: int, size: int) -> int:
    """The opponent's stones that a stone on `cell` brackets (0: the move is illegal)."""
    _, directions = _geometry(size)
    stone = 1 << cell
    flips = 0
    for shift, keep in directions:
        line = 0
        walk = _shift(stone, shift, keep)
        while walk & opp:
            line |= walk
            walk = _shift(walk, shift, keep)
        if walk & own:
            flips |= line
    return flips


def cell_name(cell: int, size: int) -> str:
    return f"{_LETTERS[cell % size]}{cell // size + 1}"


class OthelloState(GameState):
    """A position: the side to move's stones (`own`), the other side's (`opp`), who moves,
    and the moves that led here (the notation `to_text` gives back)."""

    __slots__ = ("own", "opp", "_to_move", "moves", "size", "_legal", "_terminal")

    def __init__(self, own: int, opp: int, to_move: int, moves: tuple[int, ...], size: int) -> None:
        self.own, self.opp, self._to_move, self.moves, self.size = own, opp, to_move, moves, size
        self._legal = legal_cells(own, opp, size)
        self._terminal = not self._legal and not legal_cells(opp, own, size)

    def __repr__(self) -> str:
        return f"OthelloState({self.to_text()!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OthelloState) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    @property
    def pass_action(self) -> int:
        return self.size * self.size

    @property
    def to_move(self) -> int:
        """0 (black) or 1 (white); not the ply's parity, since passes skip a turn."""
        return self._to_move

    @property
    def ply(self) -> int:
        return len(self.moves)

    @property
    def max_plies(self) -> int:
        # Every stone move fills a cell and a pass is always followed by a stone move.
        return 2 * (self.size * self.size - 4)

    @property
    def is_terminal(self) -> bool:
        return self._terminal

    @property
    def black_white(self) -> tuple[int, int]:
        """(black's stones, white's stones) as bitboards."""
        return (self.own, self.opp) if self._to_move == BLACK else (self.opp, self.own)

    def counts(self) -> tuple[int, int]:
        """(black's stone count, white's)."""
        black, white = self.black_white
        return black.bit_count(), white.bit_count()

    @property
    def winner(self) -> int | None:
        if not self._terminal:
            return None
        black, white = self.counts()
        return None if black == white else (BLACK if black > white else WHITE)

    def returns(self) -> np.ndarray:
        """Each seat's result of a finished game: +1 the winner, -1 the loser, 0 a draw."""
        if not self._terminal:
            raise GameError("returns of an unfinished game")
        out = np.zeros(2, dtype=np.float64)
        if self.winner is not None:
            out[self.winner], out[1 - self.winner] = 1.0, -1.0
        return out

    def legal_moves(self) -> list[int]:
        if self._terminal:
            return []
        if not self._legal:
            return [self.pass_action]
        return [c for c in range(self.pass_action) if self._legal >> c & 1]

    def legal_mask(self) -> np.ndarray:
        out = np.zeros(self.pass_action + 1, dtype=bool)
        out[self.legal_moves()] = True
        return out

    def play(self, action: int) -> "OthelloState":
        where = self.to_text() or "start"
        if self._terminal:
            raise IllegalMoveError(action, where, "the game is over")
        if not isinstance(action, (int, np.integer)) or not 0 <= action <= self.pass_action:
            raise IllegalMoveError(action, where, f"actions are 0..{self.pass_action} (the last: pass)")
        action = int(action)
        moves = self.moves + (action,)
        if action == self.pass_action:
            if self._legal:
                raise IllegalMoveError(action, where, "a pass is legal only without a move")
            return OthelloState(self.opp, self.own, 1 - self._to_move, moves, self.size)
        name = cell_name(action, self.size)
        if (self.own | self.opp) >> action & 1:
            raise IllegalMoveError(action, where, f"{name} is taken")
        flips = flipped_by(self.own, self.opp, action, self.size)
        if not flips:
            raise IllegalMoveError(action, where, f"{name} flips no stone")
        own = self.own | flips | (1 << action)
        return OthelloState(self.opp & ~flips, own, 1 - self._to_move, moves, self.size)

    def planes(self) -> np.ndarray:
        """Own stones, the opponent's, the legal cells, and a plane of ones (the edge)."""
        cells = self.size * self.size
        out = np.ones((4, self.size, self.size), dtype=np.float32)
        for plane, bits in enumerate((self.own, self.opp, self._legal)):
            out[plane] = np.array([bits >> c & 1 for c in range(cells)], dtype=np.float32).reshape(self.size, self.size)
        return out

    def key(self) -> tuple[int, int, int]:
        return (self.own, self.opp, self._to_move)

    def to_text(self) -> str:
        return " ".join(self.action_text(a) for a in self.moves)

    def action_text(self, action: int) -> str:
        return "pass" if action == self.pass_action else cell_name(action, self.size)

    def board_text(self) -> str:
        """The board as rows of `x` (black), `o` (white), `.`, row 1 first."""
        black, white = self.black_white
        rows = []
        for r in range(self.size):
            rows.append("".join("x" if black >> (r * self.size + c) & 1 else "o" if white >> (r * self.size + c) & 1
                                else "." for c in range(self.size)))
        return "\n".join(rows)


class Othello(Game):
    """Othello on a size x size board (even, 4..8); `Othello()` is the shipped 6x6 game."""

    num_players = 2
    words = 3
    rules_module = "app.games.othello_arrays"

    def __init__(self, size: int = 6) -> None:
        if size % 2 or not 4 <= size <= 8:
            raise GameError(f"othello size must be even, 4..8: {size}")
        self.size = size
        self.name = "othello" if size == 6 else f"othello{size}"
        self.num_actions = size * size + 1
        self.plane_shape = (4, size, size)
        self.max_plies = 2 * (size * size - 4)
        self.cell_perms = cell_symmetries(size)
        # Actions: the cells, then pass, which every symmetry keeps.
        self.action_perms = np.concatenate(
            [self.cell_perms, np.full((8, 1), size * size, dtype=np.int64)], axis=1)

    def initial_state(self) -> OthelloState:
        s, h = self.size, self.size // 2
        white = (1 << ((h - 1) * s + h - 1)) | (1 << (h * s + h))
        black = (1 << ((h - 1) * s + h)) | (1 << (h * s + h - 1))
        return OthelloState(black, white, BLACK, (), s)

    def position(self, black: int, white: int, to_move: int) -> OthelloState:
        """A position given by its stones (bitboards) and the side to move, with no move
        history (its `to_text` is empty): endgame tests and benchmark positions."""
        if black & white or (black | white) >> (self.size * self.size):
            raise GameError("black and white stones must be distinct cells of the board")
        own, opp = (black, white) if to_move == BLACK else (white, black)
        return OthelloState(own, opp, to_move, (), self.size)

    def from_board(self, rows: str, to_move: int) -> OthelloState:
        """A position from `board_text`'s picture: rows of x (black), o (white), '.', row 1 first."""
        lines = [line.strip() for line in rows.strip().splitlines()]
        if len(lines) != self.size or any(len(line) != self.size or set(line) - set("xo.") for line in lines):
            raise ParseError(f"a board is {self.size} rows of {self.size} of x, o, '.': {rows!r}")
        cells = "".join(lines)
        black = sum(1 << i for i, ch in enumerate(cells) if ch == "x")
        white = sum(1 << i for i, ch in enumerate(cells) if ch == "o")
        return self.position(black, white, to_move)

    def cell_of(self, text: str) -> int:
        """The action a move's text names (`c2`, `pass`); ParseError otherwise."""
        t = text.strip().lower()
        if t == "pass":
            return self.size * self.size
        if len(t) != 2 or t[0] not in _LETTERS[: self.size] or not t[1].isdigit() or not 1 <= int(t[1]) <= self.size:
            raise ParseError(f"{text!r} is no cell of a {self.size}x{self.size} board (a1..{cell_name(self.size ** 2 - 1, self.size)}) or 'pass'")
        return (int(t[1]) - 1) * self.size + _LETTERS.index(t[0])

    def parse(self, text: str) -> OthelloState:
        state = self.initial_state()
        for token in text.replace(",", " ").split():
            try:
                state = state.play(self.cell_of(token))
            except IllegalMoveError as err:
                raise ParseError(f"{text!r}: {err}") from err
        return state

    def action_to_text(self, action: int) -> str:
        return "pass" if action == self.size * self.size else cell_name(action, self.size)

    def symmetry_permutations(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """The eight symmetries of the square; cell i goes to `cell_perms[k][i]`, so image
        cell j takes the original's cell at the inverse permutation. A pass stays a pass."""
        return [(np.argsort(cells), np.argsort(actions)) for cells, actions in zip(self.cell_perms, self.action_perms)]

    # -- the batch form (app/games/othello_arrays.py; 6x6 only, other sizes are for tests) --

    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        from app.games import othello_arrays
        return othello_arrays.words_of(states)

    def words_planes(self, words: np.ndarray) -> np.ndarray:
        from app.games import othello_arrays
        return othello_arrays.planes(words)

    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        from app.games import othello_arrays
        return othello_arrays.legal_masks(words)

