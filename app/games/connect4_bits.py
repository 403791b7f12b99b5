"""Connect Four's bitboard helpers on Python ints (Pons' layout, as app/games/connect4.py):
shared by the rules' objects and the heuristic player, so neither imports the other."""

from __future__ import annotations

from app.games.connect4_arrays import HEIGHT, WIDTH

_COLUMN_BITS = HEIGHT + 1
_BOTTOM = [1 << (c * _COLUMN_BITS) for c in range(WIDTH)]


def _column_mask(col: int) -> int:
    return ((1 << HEIGHT) - 1) << (col * _COLUMN_BITS)


_BOTTOM_ROW = sum(_BOTTOM)
_BOARD = sum(_column_mask(c) for c in range(WIDTH))


def playable_cells(mask: int) -> int:
    """The cell each unfull column would take next (one bit per column)."""
    return (mask + _BOTTOM_ROW) & _BOARD


def _columns(cells: int) -> list[int]:
    """The columns of `cells`, at most one cell a column, in increasing order."""
    out = []
    while cells:
        low = cells & -cells
        out.append((low.bit_length() - 1) // _COLUMN_BITS)
        cells ^= low
    return out


def winning_cells(stones: int, mask: int) -> int:
    """Empty cells where `stones`' owner would make four (Pons' compute_winning_position):
    three of the four in place, in every direction, the gap at either end or inside. The
    heuristic baseline (app/games/search/heuristic.py) scores leaves by these too."""
    # vertical: three stones straight below
    cells = (stones << 1) & (stones << 2) & (stones << 3)
    for shift in (_COLUMN_BITS, HEIGHT, _COLUMN_BITS + 1):  # horizontal and both diagonals
        pair = (stones << shift) & (stones << 2 * shift)
        cells |= pair & (stones << 3 * shift)
        cells |= pair & (stones >> shift)
        pair = (stones >> shift) & (stones >> 2 * shift)
        cells |= pair & (stones << shift)
        cells |= pair & (stones >> 3 * shift)
    return cells & (_BOARD ^ mask)
