"""The three-player m,n,k game's batch form: a position as three uint64 bitboards (one per
seat, in seat order), the rules compiled by numba.

The bitboards use Connect Four's padded layout: cell (row r, column c) is bit c * 7 + r, and
bit c * 7 + 6 is an always-empty sentinel, so four in a line is found with four shifts (1: a
column, 7: a row, 6 and 8: the diagonals) and never wraps. The ply is the number of stones and
the seat to move the ply mod 3. This module is the game's compiled node rules, the contract
of app/games/array_rules.py (`play`, `to_move`, `terminal`, `legal` over a position's words),
which the array search is compiled against (with `ply_of`, for its random playouts); the same rules over three bitboards as scalars
(`legal_actions`, `after`, `finished`, `returns_of`; actions r * 6 + c) serve the tests. A
batch's network input and legal masks are arrays (`planes`, `legal_masks`).

Written apart from `MNK3State` (a grid and line scans) so each checks the other:
tests/test_mnk3.py.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

SIZE = 6
CELLS = SIZE * SIZE
PLAYERS = 3
WORDS = 3
NUM_PLAYERS = PLAYERS
NUM_ACTIONS = CELLS
MAX_PLIES = CELLS
_STRIDE = SIZE + 1
_U1 = np.uint64(1)
# action r * SIZE + c -> its bit c * 7 + r
_ACTION_BIT = np.array([(a % SIZE) * _STRIDE + a // SIZE for a in range(CELLS)], dtype=np.uint64)
_BIT_ACTION = np.full(64, -1, dtype=np.int64)
_BIT_ACTION[_ACTION_BIT.astype(np.int64)] = np.arange(CELLS)
_WIN, _LOSS = 1.0, -0.5


@njit(cache=True)
def has_line(stones: np.uint64) -> bool:
    """Four of `stones` in a line (the sentinel bits keep lines from wrapping)."""
    for s in (1, 7, 6, 8):
        shift = np.uint64(s)
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (shift + shift)):
            return True
    return False


@njit(cache=True)
def popcount(bits: np.uint64) -> np.int64:
    n = 0
    while bits:
        bits &= bits - _U1
        n += 1
    return n


@njit(cache=True)
def finished(a: np.uint64, b: np.uint64, c: np.uint64) -> bool:
    """A seat has a line, or the board is full."""
    return has_line(a) or has_line(b) or has_line(c) or popcount(a | b | c) == CELLS


@njit(cache=True)
def legal_actions(a: np.uint64, b: np.uint64, c: np.uint64) -> np.int64:
    """The empty cells of an unfinished position as a CELLS-bit action mask (0 when over)."""
    if finished(a, b, c):
        return np.int64(0)
    taken = a | b | c
    out = np.int64(0)
    for action in range(CELLS):
        if not (taken >> _ACTION_BIT[action]) & _U1:
            out |= np.int64(1) << action
    return out


@njit(cache=True)
def after(a: np.uint64, b: np.uint64, c: np.uint64, action: np.int64):
    """The three words after the seat to move takes `action` (assumed legal)."""
    stone = _U1 << _ACTION_BIT[action]
    seat = popcount(a | b | c) % PLAYERS
    if seat == 0:
        return a | stone, b, c
    if seat == 1:
        return a, b | stone, c
    return a, b, c | stone


@njit(cache=True)
def _fill_returns(a: np.uint64, b: np.uint64, c: np.uint64, out: np.ndarray) -> None:
    out[:] = 0.0
    boards = (a, b, c)
    for seat in range(PLAYERS):
        if has_line(boards[seat]):
            out[:] = _LOSS
            out[seat] = _WIN


@njit(cache=True)
def returns_of(a: np.uint64, b: np.uint64, c: np.uint64) -> np.ndarray:
    """Each seat's result of a finished position: the winner +1, the others -1/2, a draw 0."""
    out = np.zeros(PLAYERS)
    _fill_returns(a, b, c, out)
    return out


# -- the compiled node rules (app/games/array_rules.py) -------------------------------------


@njit(cache=True)
def play(words, action, out):
    a, b, c = after(words[0], words[1], words[2], action)
    out[0] = a
    out[1] = b
    out[2] = c


@njit(cache=True)
def to_move(words, ply):
    return ply % PLAYERS


@njit(cache=True)
def ply_of(words):
    """The ply from the words alone: one stone a move."""
    return popcount(words[0] | words[1] | words[2])


@njit(cache=True)
def terminal(words, ply, returns):
    if not finished(words[0], words[1], words[2]):
        return False
    _fill_returns(words[0], words[1], words[2], returns)
    return True


@njit(cache=True)
def legal(words, ply, moves):
    taken = words[0] | words[1] | words[2]
    n = 0
    for action in range(CELLS):
        moves[action] = 1 - ((taken >> _ACTION_BIT[action]) & _U1)
        n += moves[action]
    return n


# -- the batch as arrays --------------------------------------------------------------------


def words_of(states: Sequence) -> np.ndarray:
    """(N, 3) uint64: each `MNK3State`'s stones of seats 0, 1, 2."""
    out = np.zeros((len(states), WORDS), dtype=np.uint64)
    for i, state in enumerate(states):
        for cell, seat in enumerate(state.cells):
            if seat >= 0:
                out[i, seat] |= _U1 << _ACTION_BIT[cell]
    return out


@njit(cache=True)
def _actions_many(words: np.ndarray) -> np.ndarray:
    out = np.empty(len(words), dtype=np.int64)
    for i in range(len(words)):
        out[i] = legal_actions(words[i, 0], words[i, 1], words[i, 2])
    return out


def planes(words: np.ndarray) -> np.ndarray:
    """(N, 4, 6, 6) float32: the stones of the seat to move, the next seat's, the one after,
    and ones (`MNK3State.planes`)."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    n = len(words)
    bits = np.unpackbits(words.astype("<u8").view(np.uint8).reshape(n, WORDS, 8), axis=-1, bitorder="little")
    cells = bits[:, :, _ACTION_BIT.astype(np.int64)].reshape(n, WORDS, SIZE, SIZE)
    mover = cells.sum(axis=(1, 2, 3), dtype=np.int64) % PLAYERS
    order = (mover[:, None] + np.arange(PLAYERS)) % PLAYERS  # seat order from the mover
    out = np.ones((n, PLAYERS + 1, SIZE, SIZE), dtype=np.float32)
    out[:, :PLAYERS] = cells[np.arange(n)[:, None], order]
    return out


def legal_masks(words: np.ndarray) -> np.ndarray:
    """(N, 36) bool, as `MNK3State.legal_mask` (all False when the game is over)."""
    actions = _actions_many(np.ascontiguousarray(words, dtype=np.uint64)).astype(np.uint64)
    return ((actions[:, None] >> np.arange(CELLS, dtype=np.uint64)) & _U1).astype(bool)
