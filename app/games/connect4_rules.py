"""Connect Four's compiled node rules, the contract of app/games/array_rules.py: what the
array search is compiled against for this game (`Connect4.rules_module`). The bit tricks are
`connect4_arrays`' (Pons' bitboard); the threat check is this game's `threats` hook."""

from __future__ import annotations

import numpy as np
from numba import njit

from app.games import connect4_arrays as c4
from app.games.array_rules import THREAT_LOSS, THREAT_SAFE, THREAT_WIN

WORDS = c4.WORDS
NUM_ACTIONS = c4.WIDTH
NUM_PLAYERS = 2
MAX_PLIES = c4.MAX_PLIES
_S1 = np.uint64(1)
_U1 = np.uint64(1)
_BOTTOM_ROW = c4._BOTTOM_ROW
_BOARD = c4._BOARD


@njit(cache=True)
def play(words, action, out):
    position, mask = c4.play(words[0], words[1], action)
    out[0] = position
    out[1] = mask


@njit(cache=True)
def to_move(words, ply):
    return ply & 1


@njit(cache=True)
def terminal(words, ply, returns):
    if c4.has_four(words[0] ^ words[1]):  # the side that just moved made four
        mover = ply & 1
        returns[mover] = -1.0
        returns[1 - mover] = 1.0
        return True
    if ply == MAX_PLIES:
        returns[0] = 0.0
        returns[1] = 0.0
        return True
    return False


@njit(cache=True)
def _fill(bits, moves):
    n = 0
    for c in range(NUM_ACTIONS):
        moves[c] = (bits >> c) & 1
        n += moves[c]
    return n


@njit(cache=True)
def legal(words, ply, moves):
    return _fill(c4.legal_bits(words[1]), moves)


@njit(cache=True)
def threats(words, ply, moves):
    """`Connect4State.threat_outlook` on the bitboard (SearchTree's rule of e1e3464): a win on
    the spot, else the moves that do not hand the opponent one; two cells to block at once or
    no safe move is a loss in two plies."""
    position, mask = words[0], words[1]
    playable = (mask + _BOTTOM_ROW) & _BOARD
    wins = c4.winning_cells(position, mask) & playable
    if wins:
        _fill(c4.column_bits(wins), moves)
        return THREAT_WIN
    opponent_wins = c4.winning_cells(position ^ mask, mask)
    forced = playable & opponent_wins
    if forced:
        if forced & (forced - _U1):
            return THREAT_LOSS
        playable = forced
    safe = playable & ~(opponent_wins >> _S1)
    if not safe:
        return THREAT_LOSS
    _fill(c4.column_bits(safe), moves)
    return THREAT_SAFE
