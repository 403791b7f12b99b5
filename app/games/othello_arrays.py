"""Othello 6x6's batch form: a position as uint64 words, the rules compiled by numba.

A position is three words: the side to move's stones, the other side's (bit r*6+c is cell
column c, row r+1, as `othello`), and the seat to move (0 black, 1 white; passes make it
underivable from the stones). This module is Othello's compiled node rules, the contract of
app/games/array_rules.py (`play`, `to_move`, `terminal`, `legal` over a position's words),
which the array search is compiled against (with `ply_of`, for its random playouts); the same rules as scalars over bitboards
(`legal_actions`, `after`, `finished`, `returns_of`) serve the tests and `othello_solver`
(its exact search runs on `legal_cells` and `flips`). A batch's network input and legal masks
are arrays (`planes`, `legal_masks`).

Written apart from `OthelloState` (no tables shared) so that each checks the other:
tests/test_othello_arrays.py plays both on random games.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

SIZE = 6
CELLS = SIZE * SIZE
PASS = CELLS  # the action number of a pass
NUM_ACTIONS = CELLS + 1
WORDS = 3  # (own, opp, to_move)
NUM_PLAYERS = 2
MAX_PLIES = 2 * (CELLS - 4)

_BOARD = np.uint64((1 << CELLS) - 1)
_NOT_FIRST_COL = np.uint64(sum(1 << (r * SIZE + c) for r in range(SIZE) for c in range(1, SIZE)))
_NOT_LAST_COL = np.uint64(sum(1 << (r * SIZE + c) for r in range(SIZE) for c in range(SIZE - 1)))
# The eight directions as (shift amount, shift left?, cells kept after the shift): a step
# one column right (left) must not wrap into the first (last) column of the next row.
_AMOUNTS = np.array([1, 1, SIZE, SIZE, SIZE + 1, SIZE + 1, SIZE - 1, SIZE - 1], dtype=np.uint64)
_LEFT = np.array([True, False, True, False, True, False, True, False])
_KEEP = np.array([
    _NOT_FIRST_COL, _NOT_LAST_COL,  # +1 column, -1 column
    _BOARD, _BOARD,  # +1 row, -1 row
    _NOT_FIRST_COL, _NOT_LAST_COL,  # +1 row +1 column, -1 row -1 column
    _NOT_LAST_COL, _NOT_FIRST_COL,  # +1 row -1 column, -1 row +1 column
], dtype=np.uint64)
_U1 = np.uint64(1)
_CELL_BITS = np.arange(CELLS, dtype=np.int64).reshape(SIZE, SIZE)


@njit(cache=True, inline="always")
def _step(bits: np.uint64, d: np.int64) -> np.uint64:
    if _LEFT[d]:
        return (bits << _AMOUNTS[d]) & _KEEP[d] & _BOARD
    return (bits >> _AMOUNTS[d]) & _KEEP[d]


@njit(cache=True)
def legal_cells(own: np.uint64, opp: np.uint64) -> np.uint64:
    """The cells where the owner of `own` may put a stone (each brackets a line of `opp`)."""
    empty = _BOARD & ~(own | opp)
    moves = np.uint64(0)
    for d in range(8):
        line = _step(own, d) & opp
        for _ in range(SIZE - 3):
            line |= _step(line, d) & opp
        moves |= _step(line, d) & empty
    return moves


@njit(cache=True)
def flips(own: np.uint64, opp: np.uint64, cell: np.int64) -> np.uint64:
    """The stones of `opp` a stone of `own` on `cell` turns over (0: not a legal cell)."""
    out = np.uint64(0)
    stone = _U1 << np.uint64(cell)
    for d in range(8):
        line = np.uint64(0)
        walk = _step(stone, d)
        while walk & opp:
            line |= walk
            walk = _step(walk, d)
        if walk & own:
            out |= line
    return out


@njit(cache=True)
def legal_actions(own: np.uint64, opp: np.uint64) -> np.int64:
    """The legal actions as a NUM_ACTIONS-bit mask: the legal cells, else pass if the
    opponent can move, else 0 (the game is over)."""
    cells = legal_cells(own, opp)
    if cells:
        return np.int64(cells)
    if legal_cells(opp, own):
        return np.int64(1) << PASS
    return np.int64(0)


@njit(cache=True)
def after(own: np.uint64, opp: np.uint64, seat: np.uint64, action: np.int64):
    """The words after the side to move plays `action` (assumed legal): the new side to
    move's stones first, as `OthelloState.play`."""
    if action == PASS:
        return opp, own, seat ^ _U1
    turned = flips(own, opp, action)
    return opp & ~turned, own | turned | (_U1 << np.uint64(action)), seat ^ _U1


@njit(cache=True)
def finished(own: np.uint64, opp: np.uint64) -> bool:
    return legal_cells(own, opp) == 0 and legal_cells(opp, own) == 0


@njit(cache=True)
def popcount(bits: np.uint64) -> np.int64:
    n = 0
    while bits:
        bits &= bits - _U1
        n += 1
    return n


@njit(cache=True)
def _fill_returns(own: np.uint64, opp: np.uint64, seat: np.uint64, out: np.ndarray) -> None:
    margin = popcount(own) - popcount(opp)
    sign = 0.0 if margin == 0 else (1.0 if margin > 0 else -1.0)
    mover = np.int64(seat & _U1)
    out[mover] = sign
    out[1 - mover] = -sign


@njit(cache=True)
def returns_of(own: np.uint64, opp: np.uint64, seat: np.uint64) -> np.ndarray:
    """Each seat's result of a finished position (+1 win, -1 loss, 0 draw), seat 0 black."""
    out = np.zeros(2)
    _fill_returns(own, opp, seat, out)
    return out


# -- the compiled node rules (app/games/array_rules.py) -------------------------------------


@njit(cache=True)
def play(words, action, out):
    own, opp, seat = after(words[0], words[1], words[2], action)
    out[0] = own
    out[1] = opp
    out[2] = seat


@njit(cache=True)
def to_move(words, ply):
    return np.int64(words[2] & _U1)


@njit(cache=True)
def ply_of(words):
    """The stone moves of a position (its stones less the four at the start): the ply but for
    passes, which the words do not keep. No rule here reads the ply, so the search's random
    playouts, which start from this, play the same games as from the true ply."""
    return popcount(words[0] | words[1]) - 4


@njit(cache=True)
def terminal(words, ply, returns):
    if not finished(words[0], words[1]):
        return False
    _fill_returns(words[0], words[1], words[2], returns)
    return True


@njit(cache=True)
def legal(words, ply, moves):
    bits = legal_actions(words[0], words[1])
    n = 0
    for a in range(NUM_ACTIONS):
        moves[a] = (bits >> a) & 1
        n += moves[a]
    return n


# -- the batch as arrays ------------------------------------------------------------------------


def words_of(states: Sequence) -> np.ndarray:
    """(N, 3) uint64: each 6x6 `OthelloState`'s (own, opp, to_move)."""
    out = np.empty((len(states), WORDS), dtype=np.uint64)
    for i, s in enumerate(states):
        if s.size != SIZE:
            raise ValueError(f"the batch form is {SIZE}x{SIZE}; got a {s.size}x{s.size} state")
        out[i] = (s.own, s.opp, s.to_move)
    return out


@njit(cache=True)
def _legal_many(words: np.ndarray) -> np.ndarray:
    out = np.empty(len(words), dtype=np.uint64)
    for i in range(len(words)):
        out[i] = legal_cells(words[i, 0], words[i, 1])
    return out


@njit(cache=True)
def _actions_many(words: np.ndarray) -> np.ndarray:
    out = np.empty(len(words), dtype=np.int64)
    for i in range(len(words)):
        out[i] = legal_actions(words[i, 0], words[i, 1])
    return out


def _unpack(boards: np.ndarray) -> np.ndarray:
    """(N, k) uint64 bitboards -> (N, k, SIZE, SIZE) uint8 cells."""
    n, k = boards.shape
    bits = np.unpackbits(boards.astype("<u8").view(np.uint8).reshape(n, k, 8), axis=-1, bitorder="little")
    return bits[:, :, _CELL_BITS]


def planes(words: np.ndarray) -> np.ndarray:
    """(N, 4, 6, 6) float32: own stones, the opponent's, the legal cells, ones (`OthelloState.planes`)."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    out = np.ones((len(words), 4, SIZE, SIZE), dtype=np.float32)
    boards = np.stack([words[:, 0], words[:, 1], _legal_many(words)], axis=1)
    out[:, :3] = _unpack(boards)
    return out


def legal_masks(words: np.ndarray) -> np.ndarray:
    """(N, 37) bool, as `OthelloState.legal_mask` (all False when the game is over)."""
    actions = _actions_many(np.ascontiguousarray(words, dtype=np.uint64)).astype(np.uint64)
    return ((actions[:, None] >> np.arange(NUM_ACTIONS, dtype=np.uint64)) & _U1).astype(bool)
