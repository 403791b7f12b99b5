"""Exact endgame search for Othello 6x6: the best moves of a position with few empty cells.

The check the trained search is measured against (scripts/bench_games.py): a negamax with
alpha-beta over the bitboards of `othello_arrays`, compiled by numba, with a transposition
table of bounds and fastest-first move ordering (the reply with the fewest opponent moves
first) while more than a few cells are empty. A score is the final disc margin from the side
to move's view with the empty cells given to the winner (the World Othello Federation's
count); `move_scores` scores every legal move of a position exactly, so `best_moves` (the
top margin) and `outcome_moves` (every move that keeps the best win/draw/loss) follow.
About 12 empties solve in well under a second; the cost grows ~3-4x an empty.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from app.games.othello import OthelloState
from app.games.othello_arrays import CELLS, PASS, flips, legal_cells, popcount

_TT_BITS = 20
_TT_SIZE = 1 << _TT_BITS
_EXACT, _LOWER, _UPPER = 0, 1, 2
_U1 = np.uint64(1)
_MIX_OWN = np.uint64(0x9E3779B97F4A7C15)
_MIX_OPP = np.uint64(0xC2B2AE3D27D4EB4F)
_SHIFT = np.uint64(64 - _TT_BITS)
_ORDER_EMPTIES = 6  # order moves by the opponent's mobility above this many empties
_INF = 100


@njit(cache=True)
def final_margin(own: np.uint64, opp: np.uint64) -> np.int64:
    """The finished game's margin for `own`, the empty cells going to the winner."""
    a, b = popcount(own), popcount(opp)
    empties = CELLS - a - b
    if a > b:
        return a - b + empties
    if a < b:
        return a - b - empties
    return 0


@njit(cache=True)
def _slot(own: np.uint64, opp: np.uint64) -> np.int64:
    return np.int64(((own * _MIX_OWN) ^ (opp * _MIX_OPP)) >> _SHIFT)


@njit(cache=True)
def _negamax(own, opp, alpha, beta, tt_own, tt_opp, tt_value, tt_flag, counter):
    counter[0] += 1
    moves = legal_cells(own, opp)
    if moves == 0:
        if legal_cells(opp, own) == 0:
            return final_margin(own, opp)
        return -_negamax(opp, own, -beta, -alpha, tt_own, tt_opp, tt_value, tt_flag, counter)
    slot = _slot(own, opp)
    if tt_own[slot] == own and tt_opp[slot] == opp and tt_flag[slot] >= 0:
        value, flag = tt_value[slot], tt_flag[slot]
        if flag == _EXACT:
            return value
        if flag == _LOWER and value > alpha:
            alpha = value
        elif flag == _UPPER and value < beta:
            beta = value
        if alpha >= beta:
            return value
    alpha0 = alpha
    # The moves in order: fewest replies first while the tree is wide, else cell order.
    n = popcount(moves)
    cells = np.empty(n, dtype=np.int64)
    keys = np.zeros(n, dtype=np.int64)
    empties = CELLS - popcount(own | opp)
    k = 0
    bits = moves
    while bits:
        low = bits & (~bits + _U1)
        cell = np.int64(popcount(low - _U1))
        cells[k] = cell
        if empties > _ORDER_EMPTIES:
            turned = flips(own, opp, cell)
            keys[k] = popcount(legal_cells(opp & ~turned, own | turned | low))
        bits ^= low
        k += 1
    order = np.argsort(keys, kind="mergesort")
    best = -_INF
    for i in range(n):
        cell = cells[order[i]]
        turned = flips(own, opp, cell)
        value = -_negamax(opp & ~turned, own | turned | (_U1 << np.uint64(cell)), -beta, -alpha,
                          tt_own, tt_opp, tt_value, tt_flag, counter)
        if value > best:
            best = value
        if value > alpha:
            alpha = value
        if alpha >= beta:
            break
    tt_own[slot], tt_opp[slot], tt_value[slot] = own, opp, best
    tt_flag[slot] = _UPPER if best <= alpha0 else (_LOWER if best >= beta else _EXACT)
    return best


class EndgameSolver:
    """The exact search with its transposition table, kept across positions (entries are
    exact facts of a position, so a table shared by many solves stays correct)."""

    def __init__(self) -> None:
        self.tt_own = np.zeros(_TT_SIZE, dtype=np.uint64)
        self.tt_opp = np.zeros(_TT_SIZE, dtype=np.uint64)
        self.tt_value = np.zeros(_TT_SIZE, dtype=np.int64)
        self.tt_flag = np.full(_TT_SIZE, -1, dtype=np.int64)
        self.nodes = np.zeros(1, dtype=np.int64)

    def value(self, state: OthelloState) -> int:
        """The exact margin of `state` for its side to move with best play by both."""
        _check(state)
        return int(_negamax(np.uint64(state.own), np.uint64(state.opp), -_INF, _INF,
                            self.tt_own, self.tt_opp, self.tt_value, self.tt_flag, self.nodes))

    def move_scores(self, state: OthelloState) -> dict[int, int]:
        """Each legal action's exact margin for the side to move (a pass, when forced, too)."""
        _check(state)
        if state.is_terminal:
            return {}
        return {action: -self.value(state.play(action)) for action in state.legal_moves()}

    def best_moves(self, state: OthelloState) -> list[int]:
        """The actions with the best exact margin."""
        scores = self.move_scores(state)
        top = max(scores.values())
        return sorted(a for a, s in scores.items() if s == top)

    def outcome_moves(self, state: OthelloState) -> list[int]:
        """The actions that keep the best result (win, draw or loss), whatever the margin."""
        scores = self.move_scores(state)
        top = max(np.sign(s) for s in scores.values())
        return sorted(a for a, s in scores.items() if np.sign(s) == top)


def _check(state: OthelloState) -> None:
    if state.size * state.size != CELLS:
        raise ValueError(f"the endgame solver is for {CELLS}-cell boards; got {state.size}x{state.size}")


__all__ = ["EndgameSolver", "PASS", "final_margin"]
