"""Tic-tac-toe written the way a team writes its own game: outside app/, against the game
interface (app/games/base.py) and the compiled node-rules contract (app/games/array_rules.py),
loaded by import path (`node.game: "tests.user_games.tictactoe:TicTacToe"`).

A position is one uint64 word: X's stones in bits 0-8, O's in bits 9-17 (cell = 3 * row +
column); X moves first, so the side to move is the parity of the ply (or of the stone count).
This module is its own rules module: the compiled functions are at its top level.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from app.games import Game, GameError, GameState, IllegalMoveError, ParseError

WORDS = 1
NUM_ACTIONS = 9
NUM_PLAYERS = 2
MAX_PLIES = 9
LINES = np.array([0b111, 0b111000, 0b111000000, 0b001001001, 0b010010010, 0b100100100, 0b100010001, 0b001010100],
                 dtype=np.uint64)
CELLS = np.uint64(0x1FF)
_NINE = np.uint64(9)


@njit(cache=True)
def _won(stones):
    for line in LINES:
        if stones & line == line:
            return True
    return False


@njit(cache=True)
def _count(bits):
    n = 0
    while bits:
        bits &= bits - np.uint64(1)
        n += 1
    return n


@njit(cache=True)
def play(words, action, out):
    x = words[0] & CELLS
    o = (words[0] >> _NINE) & CELLS
    stone = np.uint64(1) << np.uint64(action)
    if _count(x) == _count(o):
        out[0] = words[0] | stone
    else:
        out[0] = words[0] | (stone << _NINE)


@njit(cache=True)
def ply_of(words):
    return _count(words[0] & ((CELLS << _NINE) | CELLS))


@njit(cache=True)
def to_move(words, ply):
    return ply & 1


@njit(cache=True)
def terminal(words, ply, returns):
    x = words[0] & CELLS
    o = (words[0] >> _NINE) & CELLS
    if _won(x):
        returns[0] = 1.0
        returns[1] = -1.0
        return True
    if _won(o):
        returns[0] = -1.0
        returns[1] = 1.0
        return True
    if (x | o) == CELLS:
        returns[0] = 0.0
        returns[1] = 0.0
        return True
    return False


@njit(cache=True)
def legal(words, ply, moves):
    taken = (words[0] | (words[0] >> _NINE)) & CELLS
    n = 0
    for a in range(NUM_ACTIONS):
        moves[a] = 0 if (taken >> np.uint64(a)) & np.uint64(1) else 1
        n += moves[a]
    return n


def _won_py(stones: int) -> bool:
    return any(stones & int(line) == int(line) for line in LINES)


class TicTacToeState(GameState):
    __slots__ = ("x", "o", "moves")

    def __init__(self, x: int = 0, o: int = 0, moves: str = "") -> None:
        self.x, self.o, self.moves = x, o, moves

    @property
    def to_move(self) -> int:
        return len(self.moves) & 1

    @property
    def ply(self) -> int:
        return len(self.moves)

    @property
    def max_plies(self) -> int:
        return MAX_PLIES

    @property
    def is_terminal(self) -> bool:
        return _won_py(self.x) or _won_py(self.o) or (self.x | self.o) == 0x1FF

    def returns(self) -> np.ndarray:
        if not self.is_terminal:
            raise GameError("returns() of an unfinished tic-tac-toe game")
        if _won_py(self.x):
            return np.array([1.0, -1.0])
        if _won_py(self.o):
            return np.array([-1.0, 1.0])
        return np.zeros(2)

    def legal_moves(self) -> list[int]:
        if self.is_terminal:
            return []
        return [a for a in range(9) if not ((self.x | self.o) >> a) & 1]

    def legal_mask(self) -> np.ndarray:
        mask = np.zeros(9, dtype=bool)
        mask[self.legal_moves()] = True
        return mask

    def play(self, action: int) -> "TicTacToeState":
        if action not in self.legal_moves():
            raise IllegalMoveError(action, self.moves, "cell taken, off the board or the game is over")
        stone = 1 << action
        text = self.moves + str(action + 1)
        return TicTacToeState(self.x | stone, self.o, text) if self.to_move == 0 else \
            TicTacToeState(self.x, self.o | stone, text)

    def planes(self) -> np.ndarray:
        return _planes(np.array([[self.x | (self.o << 9)]], dtype=np.uint64))[0]

    def key(self) -> tuple[int, int]:
        return self.x, self.o

    def to_text(self) -> str:
        return self.moves


def _planes(words: np.ndarray) -> np.ndarray:
    """(B, 3, 3, 3): the mover's stones, the opponent's, a plane of ones."""
    w = words[:, 0].astype(np.int64)
    x = (w[:, None] >> np.arange(9)) & 1
    o = (w[:, None] >> (np.arange(9) + 9)) & 1
    x_to_move = (x.sum(axis=1) == o.sum(axis=1))[:, None]
    own, other = np.where(x_to_move, x, o), np.where(x_to_move, o, x)
    out = np.ones((len(words), 3, 9), dtype=np.float32)
    out[:, 0], out[:, 1] = own, other
    return out.reshape(-1, 3, 3, 3)


def _d4() -> list[tuple[np.ndarray, np.ndarray]]:
    grid = np.arange(9).reshape(3, 3)
    images = []
    for k in range(4):
        for flip in (False, True):
            g = np.rot90(grid, k)
            g = g[:, ::-1] if flip else g
            images.append((g.reshape(-1).copy(), g.reshape(-1).copy()))
    return images


class TicTacToe(Game):
    name = "tictactoe"
    num_players = 2
    num_actions = NUM_ACTIONS
    plane_shape = (3, 3, 3)
    max_plies = MAX_PLIES
    words = WORDS
    rules_module = __name__

    def initial_state(self) -> TicTacToeState:
        return TicTacToeState()

    def parse(self, text: str) -> TicTacToeState:
        state = TicTacToeState()
        for i, ch in enumerate(text.strip()):
            if ch < "1" or ch > "9":
                raise ParseError(f"bad character {ch!r} at index {i} of {text!r}: cells are 1-9")
            try:
                state = state.play(int(ch) - 1)
            except IllegalMoveError as exc:
                raise ParseError(f"move {i + 1} of {text!r} is illegal: {exc.reason}") from exc
        return state

    def action_to_text(self, action: int) -> str:
        return str(action + 1)

    def symmetry_permutations(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return _d4()

    def state_words(self, states: Sequence[GameState]) -> np.ndarray:
        return np.array([[s.x | (s.o << 9)] for s in states], dtype=np.uint64).reshape(len(states), 1)

    def words_planes(self, words: np.ndarray) -> np.ndarray:
        return _planes(words)

    def words_legal_masks(self, words: np.ndarray) -> np.ndarray:
        w = words[:, 0].astype(np.int64)
        taken = ((w | (w >> 9)) & 0x1FF)[:, None] >> np.arange(9) & 1
        x, o = w & 0x1FF, (w >> 9) & 0x1FF
        over = np.array([_won_py(int(a)) or _won_py(int(b)) or (a | b) == 0x1FF for a, b in zip(x, o)])
        return (taken == 0) & ~over[:, None]
