"""Connect Four's heuristic player (`Connect4.heuristic_scores`): win now, block now, else a
shallow alpha-beta negamax on the bitboard (Pons' layout), leaves scored by open threats
(empty cells that would complete four) and centre stones."""

from __future__ import annotations

import math

from app.games.connect4_arrays import HEIGHT, WIDTH
from app.games.connect4_bits import playable_cells, winning_cells

# Connect Four bitboard constants (Pons' layout; see app/games/connect4.py).
_W, _H = WIDTH, HEIGHT
_H1 = _H + 1
_COLUMN = [((1 << _H) - 1) << (c * _H1) for c in range(_W)]
_TOP = [1 << (_H - 1 + c * _H1) for c in range(_W)]
_BOTTOM_CELL = [1 << (c * _H1) for c in range(_W)]
_CENTRE_ORDER = sorted(range(_W), key=lambda c: (abs(2 * c - (_W - 1)), -c if _W % 2 == 0 else c))  # 3 2 4 1 5 0 6
_CENTRE_WEIGHT = [(_W - 1) // 2 - abs(2 * c - (_W - 1)) // 2 for c in range(_W)]  # 0 1 2 3 2 1 0
WIN_SCORE = 10_000.0  # as app/games/search/heuristic.py
THREAT_WEIGHT = 4.0
CENTRE_WEIGHT = 1.0


def _centre_score(stones: int) -> int:
    return sum(w * (stones & _COLUMN[c]).bit_count() for c, w in enumerate(_CENTRE_WEIGHT) if w)


def _evaluate(position: int, mask: int) -> float:
    """Static score from the view of `position`'s owner (the side to move)."""
    opponent = position ^ mask
    threats = winning_cells(position, mask).bit_count() - winning_cells(opponent, mask).bit_count()
    return THREAT_WEIGHT * threats + CENTRE_WEIGHT * (_centre_score(position) - _centre_score(opponent))


def _negamax_c4(position: int, mask: int, depth: int, alpha: float, beta: float, moves_left: int) -> float:
    """Alpha-beta negamax on the bitboard; `position` is the side to move's stones."""
    playable = playable_cells(mask)
    if winning_cells(position, mask) & playable:
        return WIN_SCORE + moves_left  # win now; sooner is better
    if moves_left == 0:
        return 0.0
    if depth == 0:
        return _evaluate(position, mask)
    best = -math.inf
    for col in _CENTRE_ORDER:
        if mask & _TOP[col]:
            continue
        stone = (mask + _BOTTOM_CELL[col]) & _COLUMN[col]
        new_mask = mask | stone
        score = -_negamax_c4(position ^ mask, new_mask, depth - 1, -beta, -alpha, moves_left - 1)
        if score > best:
            best = score
        if best > alpha:
            alpha = best
        if alpha >= beta:
            break
    return best


def connect4_move_scores(position: int, mask: int, depth: int) -> dict[int, float]:
    """Score of each legal column for the side to move: forced wins and blocks first, then negamax."""
    playable = playable_cells(mask)
    legal = [c for c in range(_W) if not mask & _TOP[c]]
    mine = winning_cells(position, mask) & playable
    wins = [c for c in legal if mine & _COLUMN[c]]
    if wins:
        return {c: (WIN_SCORE * 2 if c in wins else -WIN_SCORE * 2) for c in legal}
    theirs = winning_cells(position ^ mask, mask) & playable
    blocks = [c for c in legal if theirs & _COLUMN[c]]
    if blocks:  # two blocks needed means the game is lost anyway; block the first
        return {c: (WIN_SCORE if c == blocks[0] else -WIN_SCORE) for c in legal}
    moves_left = _W * _H - mask.bit_count()
    scores = {}
    for col in legal:
        stone = (mask + _BOTTOM_CELL[col]) & _COLUMN[col]
        scores[col] = -_negamax_c4(position ^ mask, mask | stone, max(depth - 1, 0),
                                   -math.inf, math.inf, moves_left - 1)
    return scores
