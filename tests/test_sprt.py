"""SPRT: exact on Bernoulli data, early stop on mismatches, cap on equal players, error rates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.games.train.sprt import (
    SprtDecision, elo_to_score, score_to_elo, sprt_bounds, sprt_decision, sprt_llr,
)

ALPHA = BETA = 0.05


def simulate_match(rng: np.random.Generator, p_win: float, p_draw: float, elo0: float, elo1: float,
                   cap: int) -> tuple[SprtDecision, int]:
    """Play a simulated match game by game through `sprt_decision`, as the gauntlet does."""
    outcomes = rng.choice(3, size=cap, p=[p_win, p_draw, 1.0 - p_win - p_draw])
    w = d = l = 0
    for n, o in enumerate(outcomes, start=1):
        w, d, l = w + (o == 0), d + (o == 1), l + (o == 2)
        result = sprt_decision(w, d, l, elo0, elo1, ALPHA, BETA)
        if result.decision is not SprtDecision.CONTINUE:
            return result.decision, n
    return SprtDecision.CONTINUE, cap


def test_bounds_are_walds() -> None:
    lower, upper = sprt_bounds(0.05, 0.05)
    assert lower == pytest.approx(math.log(0.05 / 0.95))
    assert upper == pytest.approx(math.log(0.95 / 0.05))
    with pytest.raises(ValueError, match=r"alpha and beta must lie in \(0, 0.5\), got alpha=0.0"):
        sprt_bounds(0.0, 0.05)


def test_without_draws_it_is_the_exact_bernoulli_sprt() -> None:
    s0, s1 = elo_to_score(0.0), elo_to_score(35.0)
    expected = 55 * math.log(s1 / s0) + 45 * math.log((1 - s1) / (1 - s0))
    assert sprt_llr(55, 0, 45, 0.0, 35.0) == pytest.approx(expected, rel=1e-2, abs=5e-3)


def test_elo_score_round_trip() -> None:
    for elo in (-400.0, -35.0, 0.0, 100.0, 700.0):
        assert score_to_elo(elo_to_score(elo)) == pytest.approx(elo)


def test_all_draws_reject_and_all_wins_accept() -> None:
    assert sprt_decision(0, 40, 0, 0.0, 35.0, ALPHA, BETA).decision is SprtDecision.REJECT
    assert sprt_decision(40, 0, 0, 0.0, 35.0, ALPHA, BETA).decision is SprtDecision.ACCEPT
    assert sprt_decision(0, 0, 0, 0.0, 35.0, ALPHA, BETA).decision is SprtDecision.CONTINUE


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="elo1"):
        sprt_decision(1, 1, 1, 10.0, 5.0, ALPHA, BETA)
    with pytest.raises(ValueError, match="negative"):
        sprt_decision(-1, 0, 0, 0.0, 35.0, ALPHA, BETA)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(0, 300), st.integers(0, 300))
def test_llr_rises_with_a_win_and_falls_with_a_loss(w: int, d: int, l: int) -> None:
    base = sprt_llr(w, d, l, 0.0, 35.0)
    assert math.isfinite(base)
    assert sprt_llr(w + 1, d, l, 0.0, 35.0) > base - 1e-9
    assert sprt_llr(w, d, l + 1, 0.0, 35.0) < base + 1e-9


@pytest.mark.timeout(60)
def test_strong_mismatch_stops_early_and_accepts() -> None:
    rng = np.random.default_rng(1)
    for _ in range(50):
        decision, games = simulate_match(rng, 0.9, 0.05, 0.0, 35.0, cap=200)
        assert decision is SprtDecision.ACCEPT
        assert games < 60
    for _ in range(50):  # and a much weaker candidate is rejected just as fast
        decision, games = simulate_match(rng, 0.1, 0.05, 0.0, 35.0, cap=200)
        assert decision is SprtDecision.REJECT
        assert games < 60


@pytest.mark.timeout(60)
def test_equal_players_mostly_run_to_the_cap() -> None:
    rng = np.random.default_rng(2)
    results = [simulate_match(rng, 0.4, 0.2, 0.0, 35.0, cap=200) for _ in range(100)]
    at_cap = sum(decision is SprtDecision.CONTINUE for decision, _ in results)
    accepted = sum(decision is SprtDecision.ACCEPT for decision, _ in results)
    assert at_cap >= 70
    assert accepted <= 5


@pytest.mark.timeout(120)
@pytest.mark.parametrize("draw_rate", [0.0, 0.3])
def test_error_rates_match_alpha_and_beta(draw_rate: float) -> None:
    """Uncapped matches with the truth at H0 accept <= alpha, with the truth at H1 reject <= beta."""
    elo0, elo1 = 0.0, 100.0  # a wide gap keeps the simulation short; the test is the same
    rng = np.random.default_rng(3)
    runs = 300
    slack = 3 * math.sqrt(ALPHA * (1 - ALPHA) / runs)
    for true_elo, wrong in ((elo0, SprtDecision.ACCEPT), (elo1, SprtDecision.REJECT)):
        s = elo_to_score(true_elo)
        p_win = s - draw_rate / 2
        outcomes = [simulate_match(rng, p_win, draw_rate, elo0, elo1, cap=5000)[0] for _ in range(runs)]
        assert SprtDecision.CONTINUE not in outcomes
        rate = sum(o is wrong for o in outcomes) / runs
        assert rate <= ALPHA + slack, f"true elo {true_elo}: wrong decision rate {rate:.3f}"
