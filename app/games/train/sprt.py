"""Sequential probability ratio test on match results: stop a match as soon as it is decided.

A match against the current best is the expensive part of a gauntlet; most candidates are
clearly better or clearly not, and a fixed game count wastes the clear cases. The test weighs
H0 "the candidate is elo0 stronger" against H1 "it is elo1 stronger" and stops when the
log-likelihood ratio leaves the Wald bounds set by alpha (false accept) and beta (false
reject).

The likelihood is the generalised (trinomial) one: the draw rate is a nuisance parameter, so
under each hypothesis the outcome distribution is the maximum-likelihood trinomial whose
expected score equals that hypothesis' score (empirical likelihood with a mean constraint).
With no draws this reduces to the exact Bernoulli SPRT. Empty outcome classes get a tiny
pseudo-count, as fishtest does, so a run of wins still has a finite, sensible LLR. Everything
here is pure.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

OUTCOME_SCORES = (1.0, 0.5, 0.0)  # win, draw, loss
PSEUDO_COUNT = 1e-3  # replaces an empty outcome class, so the constrained MLE exists


class SprtDecision(str, enum.Enum):
    ACCEPT = "accept"  # H1: the candidate is stronger by elo1 (promote-worthy)
    REJECT = "reject"  # H0: it is not stronger than elo0
    CONTINUE = "continue"  # undecided: play more games (or stop at the cap)


@dataclass(frozen=True)
class SprtResult:
    decision: SprtDecision
    llr: float
    lower: float
    upper: float
    games: int

    def to_json(self) -> dict:
        return {"decision": self.decision.value, "llr": self.llr, "lower": self.lower,
                "upper": self.upper, "games": self.games}


def elo_to_score(elo: float) -> float:
    """Expected score of a player `elo` points stronger (logistic Elo)."""
    return 1.0 / (1.0 + 10.0 ** (-elo / 400.0))


def score_to_elo(score: float) -> float:
    score = min(max(score, 1e-9), 1.0 - 1e-9)
    return -400.0 * math.log10(1.0 / score - 1.0)


def sprt_bounds(alpha: float, beta: float) -> tuple[float, float]:
    """Wald's (lower, upper) LLR bounds."""
    if not (0.0 < alpha < 0.5 and 0.0 < beta < 0.5):
        raise ValueError(f"alpha and beta must lie in (0, 0.5), got alpha={alpha}, beta={beta}")
    return math.log(beta / (1.0 - alpha)), math.log((1.0 - beta) / alpha)


def _constrained_loglik(freqs: tuple[float, ...], target: float) -> float:
    """max sum f_i log p_i over trinomials p with sum p_i a_i = target (per unit count).

    The optimum is p_i = f_i / (1 + lam d_i), d_i = a_i - target, where lam solves
    g(lam) = sum f_i d_i / (1 + lam d_i) = 0 on the interval where every denominator is
    positive. g is decreasing there with exactly one root; clearing the denominators makes it
    a quadratic, solved in closed form (bisection is the fallback for round-off).
    """
    d = [a - target for a in OUTCOME_SCORES]
    lo = -1.0 / max(d)  # 1 + lam * max(d) > 0
    hi = -1.0 / min(d)  # 1 + lam * min(d) > 0

    def g(lam: float) -> float:
        return sum(f * di / (1.0 + lam * di) for f, di in zip(freqs, d))

    c0 = c1 = c2 = 0.0
    for i, (f, di) in enumerate(zip(freqs, d)):
        a, b = (d[j] for j in range(3) if j != i)
        c0 += f * di
        c1 += f * di * (a + b)
        c2 += f * di * a * b
    lam = None
    if abs(c2) < 1e-15:
        roots = [-c0 / c1] if c1 else []
    else:
        disc = c1 * c1 - 4.0 * c2 * c0
        if disc >= 0.0:
            q = -0.5 * (c1 + math.copysign(math.sqrt(disc), c1))
            roots = [q / c2] + ([c0 / q] if q else [])
        else:
            roots = []
    for r in roots:
        if lo < r < hi and min(1.0 + r * di for di in d) > 1e-12:
            lam = r
            break
    if lam is None:  # round-off pushed the root out: bisect
        lo, hi = lo + 1e-12, hi - 1e-12
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if g(mid) > 0.0:
                lo = mid
            else:
                hi = mid
        lam = 0.5 * (lo + hi)
    return sum(f * math.log(f / (1.0 + lam * di)) for f, di in zip(freqs, d))


def sprt_llr(wins: float, draws: float, losses: float, elo0: float, elo1: float) -> float:
    """Log-likelihood ratio of H1 (elo1) over H0 (elo0) for the results (candidate's view)."""
    n = wins + draws + losses
    if n <= 0:
        return 0.0
    counts = [c if c > 0 else PSEUDO_COUNT for c in (wins, draws, losses)]
    total = sum(counts)
    freqs = tuple(c / total for c in counts)
    s0, s1 = elo_to_score(elo0), elo_to_score(elo1)
    return n * (_constrained_loglik(freqs, s1) - _constrained_loglik(freqs, s0))


def sprt_decision(
    wins: int, draws: int, losses: int,
    elo0: float, elo1: float, alpha: float, beta: float,
) -> SprtResult:
    """ACCEPT when the LLR reaches the upper bound, REJECT at the lower one, else CONTINUE."""
    if min(wins, draws, losses) < 0:
        raise ValueError(f"negative result counts: W={wins} D={draws} L={losses}")
    if not elo1 > elo0:
        raise ValueError(f"elo1 ({elo1}) must exceed elo0 ({elo0})")
    lower, upper = sprt_bounds(alpha, beta)
    llr = sprt_llr(wins, draws, losses, elo0, elo1)
    if llr >= upper:
        decision = SprtDecision.ACCEPT
    elif llr <= lower:
        decision = SprtDecision.REJECT
    else:
        decision = SprtDecision.CONTINUE
    return SprtResult(decision, llr, lower, upper, wins + draws + losses)
