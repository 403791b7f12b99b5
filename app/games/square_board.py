"""The eight symmetries of a square board as index permutations, for the games played on one
(Othello, the three-player m,n,k game): `Game.symmetry_permutations` is built from these."""

from __future__ import annotations

import numpy as np


def cell_symmetries(size: int) -> np.ndarray:
    """(8, size*size) int64: for each symmetry of the square (the identity first), the cell
    each cell (r * size + c) goes to."""
    out = []
    for transpose in (False, True):
        for flip_rows in (False, True):
            for flip_cols in (False, True):
                perm = np.empty(size * size, dtype=np.int64)
                for r in range(size):
                    for c in range(size):
                        rr, cc = (c, r) if transpose else (r, c)
                        rr = size - 1 - rr if flip_rows else rr
                        cc = size - 1 - cc if flip_cols else cc
                        perm[r * size + c] = rr * size + cc
                out.append(perm)
    return np.stack(out)
