"""How good an exported window of games is as training data (the quality -> training loop,
app/coordination/pipeline/feedback_loops.py): computed at export from the games it took and
the policy targets it wrote, and kept in the dataset's manifest as `quality`.

Three shares, each in [0, 1]: games that repeat an earlier game's moves exactly (a narrow
self-play teaches the same lines twice), games decided by a win (a draw's value target says
little), and the mean entropy of the policy targets over log(num_actions) (a collapsed search
gives one-hot targets).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.db.replay_db import GameRecord

ENTROPY_CHUNK = 65536  # rows of policy targets per step: bounded memory on a large window


def policy_entropy(policy: np.ndarray, num_actions: int) -> float:
    """Mean entropy of the rows of `policy` (each a distribution) over log(num_actions)."""
    if len(policy) == 0 or num_actions < 2:
        return 0.0
    total = 0.0
    for start in range(0, len(policy), ENTROPY_CHUNK):
        p = np.asarray(policy[start:start + ENTROPY_CHUNK], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, -p * np.log(p), 0.0)
        total += float(terms.sum())
    return min(1.0, total / len(policy) / math.log(num_actions))


def data_quality(records: Sequence[GameRecord], policies: Sequence[np.ndarray], num_actions: int) -> dict:
    """The manifest's `quality` object (feedback_loops.DataQuality reads it back)."""
    seen: set[tuple[int, ...]] = set()
    duplicates = decisive = 0
    for record in records:
        line = tuple(m.action for m in record.moves)
        duplicates += line in seen
        seen.add(line)
        decisive += record.winner is not None
    games = len(records)
    rows = sum(len(p) for p in policies)
    entropy = sum(policy_entropy(p, num_actions) * len(p) for p in policies) / rows if rows else 0.0
    return {"games": games, "duplicate_share": round(duplicates / games, 6) if games else 0.0,
            "decisive_share": round(decisive / games, 6) if games else 0.0, "policy_entropy": round(entropy, 6)}
