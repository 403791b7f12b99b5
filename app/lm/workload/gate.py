"""The promotion gate of the LM workload: is the candidate better than the best on the same
held-out prompts, with the configured confidence? Pure functions, no I/O.

Both models answer the same prompts (greedy), so the rewards are paired per prompt and the
test is on the per-prompt differences, which removes the prompts' own difficulty from the
noise. Two one-sided tests, both of "the candidate is no better" against "it is better":

- `sign` (default): the exact sign test on the prompts where the two differ (ties carry no
  information and are dropped). With 0/1 rewards this is the exact McNemar test. It assumes
  nothing about the size of the differences, so a few large partial-credit swings cannot
  carry it; the mean difference must also exceed `min_improvement`, so many tiny wins and a
  few large losses never promote.
- `bootstrap`: the percentile bootstrap of the mean difference (resampling prompts, seeded):
  promote when the lower one-sided bound is above `min_improvement`.

`reward_interval` gives a model's held-out mean with its interval for /progress: the Wilson
interval, valid for any reward in [0, 1] (its variance is at most mean * (1 - mean)), else a
normal interval from the sample deviation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from statistics import NormalDist
from typing import Literal

import numpy as np

Method = Literal["sign", "bootstrap"]


@dataclass(frozen=True)
class GateResult:
    promote: bool
    method: str
    n: int  # prompts
    wins: int  # prompts where the candidate scored higher
    losses: int
    ties: int
    mean_diff: float  # mean of candidate - best over the prompts
    p_value: float  # one-sided, under "the candidate is no better"
    interval: tuple[float, float]  # two-sided `confidence` bootstrap interval of mean_diff
    reason: str

    def summary(self) -> str:
        """The decision's one line, as the pipeline records it (the seam's Verdict)."""
        return ("pass: " if self.promote else "fail: ") + self.reason

    def to_json(self) -> dict:
        out = asdict(self)
        out["interval"] = list(self.interval)
        return out


def sign_test_p(wins: int, losses: int) -> float:
    """P(at least `wins` of wins + losses fair coin flips come up heads): exact, one-sided."""
    if wins < 0 or losses < 0:
        raise ValueError("wins and losses must be >= 0")
    m = wins + losses
    if m == 0:
        return 1.0
    return min(1.0, sum(math.comb(m, k) for k in range(wins, m + 1)) / 2**m)


def bootstrap_means(diffs: Sequence[float], samples: int, seed: int) -> np.ndarray:
    """Means of `samples` resamples (with replacement) of `diffs`, from a seeded generator."""
    d = np.asarray(diffs, dtype=np.float64)
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(d), size=(samples, len(d)))
    return d[picks].mean(axis=1)


def paired_gate(candidate: Sequence[float], best: Sequence[float], *, confidence: float = 0.95,
                method: Method = "sign", min_improvement: float = 0.0, bootstrap_samples: int = 2000,
                seed: int = 0) -> GateResult:
    """Promote only when the candidate is better with `confidence` (and by more than
    `min_improvement` on average). `candidate[i]` and `best[i]` are the same prompt's rewards."""
    if len(candidate) != len(best):
        raise ValueError(f"paired rewards must align: {len(candidate)} candidate vs {len(best)} best")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence {confidence} must be in (0.5, 1)")
    if method not in ("sign", "bootstrap"):
        raise ValueError(f"unknown gate method {method!r}: expected sign or bootstrap")
    n = len(candidate)
    if n == 0:
        return GateResult(False, method, 0, 0, 0, 0, 0.0, 1.0, (0.0, 0.0), "no held-out prompts")
    diffs = [float(c) - float(b) for c, b in zip(candidate, best)]
    wins = sum(d > 0 for d in diffs)
    losses = sum(d < 0 for d in diffs)
    mean_diff = sum(diffs) / n
    means = bootstrap_means(diffs, bootstrap_samples, seed)
    alpha = 1.0 - confidence
    interval = (float(np.quantile(means, alpha / 2)), float(np.quantile(means, 1 - alpha / 2)))
    if method == "sign":
        p = sign_test_p(wins, losses)
        significant = p <= alpha
    else:
        p = float(np.mean(means <= min_improvement))
        significant = float(np.quantile(means, alpha)) > min_improvement
    promote = significant and mean_diff > min_improvement
    if promote:
        reason = f"better: {wins} wins, {losses} losses, p={p:.3g} <= {alpha:.3g}"
    elif not significant:
        reason = f"not significant: {wins} wins, {losses} losses, p={p:.3g} > {alpha:.3g}"
    else:
        reason = f"mean gain {mean_diff:.4g} is not above min_improvement {min_improvement:.4g}"
    return GateResult(promote, method, n, wins, losses, n - wins - losses, mean_diff, p, interval, reason)


def reward_interval(rewards: Sequence[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of a model's held-out rewards."""
    n = len(rewards)
    if n == 0:
        raise ValueError("no rewards to summarise")
    mean = sum(rewards) / n
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    if all(0.0 <= r <= 1.0 for r in rewards):
        centre = (mean + z * z / (2 * n)) / (1 + z * z / n)
        half = z * math.sqrt(max(mean * (1 - mean), 0.0) / n + z * z / (4 * n * n)) / (1 + z * z / n)
        return mean, max(0.0, centre - half), min(1.0, centre + half)
    sd = math.sqrt(sum((r - mean) ** 2 for r in rewards) / max(n - 1, 1))
    return mean, mean - z * sd / math.sqrt(n), mean + z * sd / math.sqrt(n)
