"""Connect Four's batch form: many positions as uint64 words, the rules as array operations.

A position is two words, `position` (the stones of the side to move) and `mask` (all stones),
laid out as in `connect4` (Pons' bitboard: column c holds bits 7c .. 7c+5, bit 7c+6 is an
always-empty sentinel); the ply is the number of stones, the move string is not kept. A batch
is a uint64 array (N, 2). What a whole batch needs at once is a numpy operation here: its
network input (`planes`), its legal masks. What the search needs per node it creates (drop a
stone, is the game over, the one-ply threat check of `Connect4State.threat_outlook`) is a
scalar function compiled by numba (`play`, `node_facts`), so the array search
(app/games/search/search_kernel.py) calls it inside its own compiled loop: per node, a numpy call on a
one-element array costs ~1 us, the compiled function ~20 ns.

Every function gives what `Connect4State` gives for the same position; tests/test_connect4_arrays.py
checks them against it on random positions.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from numba import njit

WIDTH = 7  # as app/games/connect4.py, which builds on this module
HEIGHT = 6
WORDS = 2  # uint64 words a position takes: (position, mask)
MAX_PLIES = WIDTH * HEIGHT
_COLUMN_BITS = HEIGHT + 1
_U1 = np.uint64(1)
_COLUMN_SHIFT = np.uint64(_COLUMN_BITS)
_BOTTOM_ROW = np.uint64(sum(1 << (c * _COLUMN_BITS) for c in range(WIDTH)))
_BOARD = np.uint64(sum(((1 << HEIGHT) - 1) << (c * _COLUMN_BITS) for c in range(WIDTH)))
_TOP_BITS = np.array([1 << (HEIGHT - 1 + c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_BOTTOM_BITS = np.array([1 << (c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_COLUMN_MASKS = np.array([((1 << HEIGHT) - 1) << (c * _COLUMN_BITS) for c in range(WIDTH)], dtype=np.uint64)
_LOW_COLUMN = np.uint64((1 << HEIGHT) - 1)
_S1 = np.uint64(1)
_S2 = np.uint64(2)
_S3 = np.uint64(3)
_DIRECTIONS = (_COLUMN_BITS, HEIGHT, _COLUMN_BITS + 1, 1)  # bit shifts: across columns, both diagonals, up a column
_LINES = _DIRECTIONS[:3]  # every direction but up a column
_CELL_BITS = np.array([[c * _COLUMN_BITS + r for c in range(WIDTH)] for r in range(HEIGHT)], dtype=np.int64)


# -- the batch as arrays (numpy) -----------------------------------------------------------


def words_of(states: Sequence) -> np.ndarray:
    """(N, 2) uint64: each `Connect4State`'s (position, mask)."""
    out = np.empty((len(states), WORDS), dtype=np.uint64)
    out[:, 0] = np.fromiter((s.position for s in states), dtype=np.uint64, count=len(states))
    out[:, 1] = np.fromiter((s.mask for s in states), dtype=np.uint64, count=len(states))
    return out


def planes(words: np.ndarray) -> np.ndarray:
    """The network input of every position, (N, 3, HEIGHT, WIDTH) float32: own stones, the
    opponent's, a plane of ones (`Connect4State.planes`), from one unpacking of all words."""
    n = len(words)
    own = words[:, 0]
    boards = np.stack([own, own ^ words[:, 1]], axis=1).astype("<u8")  # little-endian bytes, whatever the host
    bits = np.unpackbits(boards.view(np.uint8).reshape(n, 2, 8), axis=-1,
                         bitorder="little")  # (N, 2, 64): bit i of each board at [..., i]
    out = np.ones((n, 3, HEIGHT, WIDTH), dtype=np.float32)
    out[:, :2] = bits[:, :, _CELL_BITS]
    return out


def legal_masks(words: np.ndarray) -> np.ndarray:
    """(N, WIDTH) bool: a column is open while its top cell is empty and the game goes on."""
    mask = words[:, 1]
    live = ~has_four_many(words[:, 0] ^ mask) & (mask != _BOARD)
    return ((mask[:, None] & _TOP_BITS) == 0) & live[:, None]


def has_four_many(stones: np.ndarray) -> np.ndarray:
    """`connect4.has_four` of every bitboard in a uint64 array."""
    found = np.zeros(stones.shape, dtype=bool)
    for s in (_COLUMN_BITS, HEIGHT, _COLUMN_BITS + 1, 1):
        shift, double = np.uint64(s), np.uint64(2 * s)
        pairs = stones & (stones >> shift)
        found |= (pairs & (pairs >> double)) != 0
    return found


# -- the rules one position at a time, compiled (numba) ----------------------------------------


@njit(cache=True, inline="always")
def has_four(stones: np.uint64) -> bool:
    for s in _DIRECTIONS:
        shift = np.uint64(s)
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> (shift + shift)):
            return True
    return False


@njit(cache=True, inline="always")
def winning_cells(stones: np.uint64, mask: np.uint64) -> np.uint64:
    """Pons' compute_winning_position, as `connect4.winning_cells`."""
    cells = (stones << _S1) & (stones << _S2) & (stones << _S3)
    for s in _LINES:
        shift = np.uint64(s)
        pair = (stones << shift) & (stones << (shift + shift))
        cells |= pair & (stones << (shift * _S3))
        cells |= pair & (stones >> shift)
        pair = (stones >> shift) & (stones >> (shift + shift))
        cells |= pair & (stones << shift)
        cells |= pair & (stones >> (shift * _S3))
    return cells & (_BOARD ^ mask)


@njit(cache=True, inline="always")
def column_bits(cells: np.uint64) -> np.int64:
    """The columns that hold a bit of `cells`, as a WIDTH-bit mask (bit c = column c)."""
    out = 0
    for c in range(WIDTH):
        if (cells >> np.uint64(c * _COLUMN_BITS)) & _LOW_COLUMN:
            out |= 1 << c
    return out


@njit(cache=True, inline="always")
def legal_bits(mask: np.uint64) -> np.int64:
    """The open columns of an unfinished position, as a WIDTH-bit mask."""
    out = 0
    for c in range(WIDTH):
        if not (mask & _TOP_BITS[c]):
            out |= 1 << c
    return out


@njit(cache=True, inline="always")
def play(position: np.uint64, mask: np.uint64, column: np.int64):
    """(position, mask) after the side to move drops a stone in `column` (assumed open): the
    new side to move's stones first, as `Connect4State.play`."""
    stone = (mask + _BOTTOM_BITS[column]) & _COLUMN_MASKS[column]
    mover = position | stone
    new_mask = mask | stone
    return mover ^ new_mask, new_mask


@njit(cache=True, inline="always")
def result_scale(plies: np.int64, length_discount: float) -> float:
    """`app.games.base.result_scale` for Connect Four's 42 plies (the same float operations)."""
    return 1.0 - length_discount * plies / MAX_PLIES


@njit(cache=True)
def node_facts(position: np.uint64, mask: np.uint64, ply: np.int64, length_discount: float, threat_check: bool):
    """What a search knows of a position the moment it creates its node:
    (proven, moves, legal), where `proven` is the exact value from the side to move's view or
    NaN, `moves` the WIDTH-bit mask of the moves the search spreads over (-1: not narrowed, all
    legal moves), `legal` 0 for a finished game (nothing to expand) and -1 otherwise.

    A finished game is worth its result; with `threat_check` (SearchTree's rule of e1e3464,
    `Connect4State.threat_outlook`): a win on the spot proves a win next ply and only the
    winning moves are searched, no safe move proves a loss in two plies, else only the safe
    moves are searched."""
    if has_four(position ^ mask):  # the side that just moved made four
        return -result_scale(ply, length_discount), -1, 0
    if ply == MAX_PLIES:
        return 0.0, -1, 0
    if not threat_check:
        return math.nan, -1, -1
    playable = (mask + _BOTTOM_ROW) & _BOARD
    wins = winning_cells(position, mask) & playable
    if wins:
        return result_scale(ply + 1, length_discount), column_bits(wins), -1
    threats = winning_cells(position ^ mask, mask)
    forced = playable & threats
    if forced:
        if forced & (forced - _U1):  # two cells to block at once: every move loses
            return -result_scale(ply + 2, length_discount), -1, -1
        playable = forced
    safe = playable & ~(threats >> _S1)
    if not safe:
        return -result_scale(ply + 2, length_discount), -1, -1
    return math.nan, column_bits(safe), -1
