"""The eight symmetries of a square board as index permutations, for the games played on one
(Othello, the three-player m,n,k game): export multiplies its samples by them."""

from __future__ import annotations

from typing import Sequence

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


def symmetric_images(cell_perms: np.ndarray, action_perms: np.ndarray, planes: np.ndarray,
                     policy: np.ndarray) -> Sequence[tuple[np.ndarray, np.ndarray]]:
    """Every image of (planes, policy), of one sample or a batch (a leading axis on both).

    Cell i goes to `perm[i]`, so the image's value at j is the original's at the inverse
    permutation's j; actions past the cells (a pass) are kept by `action_perms`."""
    size = planes.shape[-1]
    flat = planes.reshape(*planes.shape[:-2], size * size)
    return [(flat[..., np.argsort(perm)].reshape(planes.shape), policy[..., np.argsort(action_perm)])
            for perm, action_perm in zip(cell_perms, action_perms)]
