"""What a search says about its root, and how a move is chosen from it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SearchResult:
    """What a search says about its root, every array of length num_actions.

    visits: normalised root visit distribution (the policy training target);
    counts: raw root visit counts; q: mean value per root move from the side to move
    (0 where unvisited); prior: the evaluator's prior at the root (no noise);
    root_value: search value of the root, side to move's view (exact when proven);
    proven: the root's exact value when the search solved it, else None;
    child_proven: each move's exact value from the root's view where its child is solved,
    NaN elsewhere.
    """

    visits: np.ndarray
    counts: np.ndarray
    q: np.ndarray
    prior: np.ndarray
    root_value: float
    proven: float | None
    child_proven: np.ndarray | None = None

    @property
    def best_action(self) -> int:
        """Most visited move; ties go to the higher prior, then the lower index. A solved root
        plays a move its proof rests on: visits can still favour a slower win (a proven
        child's visits back up an exact value, others the network's guesses)."""
        counts = self.counts
        if self.proven is not None and self.child_proven is not None:
            proving = np.isclose(self.child_proven, self.proven, rtol=0.0, atol=1e-9)
            if proving.any():
                counts = np.where(proving, counts + 1.0, -1.0)
        top = np.flatnonzero(counts == counts.max())
        return int(top[np.argmax(self.prior[top])])


def temperature_for_ply(ply: int, temperature_moves: int) -> float:
    """1.0 for the first `temperature_moves` plies of a game (exploration), then 0 (greedy)."""
    return 1.0 if ply < temperature_moves else 0.0


def choose_action(visits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Sample a move with probability proportional to visits^(1/temperature).

    Temperature 0 plays a most visited move, breaking ties at random so greedy self-play
    games still differ.
    """
    visits = np.asarray(visits, dtype=np.float64)
    if visits.sum() <= 0:
        raise ValueError("choose_action needs at least one visited move")
    if temperature <= 0:
        top = np.flatnonzero(visits == visits.max())
        return int(top[rng.integers(len(top))]) if len(top) > 1 else int(top[0])
    weights = visits ** (1.0 / temperature) if temperature != 1.0 else visits
    return int(rng.choice(len(weights), p=weights / weights.sum()))
