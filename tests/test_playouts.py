"""Vectorised Connect Four playouts agree with the rules engine and with known statistics."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.games import get_game
from app.games.connect4 import has_four
from app.games.connect4_playouts import has_four_many, playout_values, random_playouts

GAME = get_game("connect4")


def random_state(seed: int, plies: int):
    rng = random.Random(seed)
    state = GAME.initial_state()
    for _ in range(plies):
        if state.is_terminal:
            break
        state = state.play(rng.choice(state.legal_moves()))
    return state


def python_playout(state, rng: random.Random) -> int:
    start = state
    while not state.is_terminal:
        state = state.play(rng.choice(state.legal_moves()))
    if state.winner is None:
        return 0
    return 1 if state.winner == start.to_move else -1


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 42))
def test_has_four_many_matches_the_scalar_rule(seed: int, plies: int) -> None:
    state = random_state(seed, plies)
    boards = [state.position, state.position ^ state.mask, state.mask]
    got = has_four_many(np.array(boards, dtype=np.uint64))
    assert got.tolist() == [has_four(b) for b in boards]


def test_random_games_from_the_start_match_known_rates() -> None:
    # Uniformly random Connect Four: the first player wins ~55.8 %, draws ~0.3 %.
    zeros = np.zeros(40000, dtype=np.uint64)
    outcome = random_playouts(zeros, zeros, np.random.default_rng(1))
    assert set(np.unique(outcome)) <= {-1, 0, 1}
    assert abs((outcome == 1).mean() - 0.558) < 0.015
    assert (outcome == 0).mean() < 0.01


def test_finished_starts_score_as_they_stand() -> None:
    won = GAME.parse("1212121")  # the first player has four in column 1; the second is to move
    assert won.is_terminal
    out = random_playouts(np.array([won.position], np.uint64), np.array([won.mask], np.uint64),
                          np.random.default_rng(0))
    assert out.tolist() == [-1]


def test_one_legal_move_left_gives_the_exact_result() -> None:
    # Find a drawn random game; one ply before its end, every playout must be a draw.
    rng = random.Random(7)
    for _ in range(5000):
        moves, state = [], GAME.initial_state()
        while not state.is_terminal:
            m = rng.choice(state.legal_moves())
            moves.append(m)
            state = state.play(m)
        if state.winner is None:
            break
    else:
        pytest.fail("no drawn random game found")
    before = GAME.initial_state()
    for m in moves[:-1]:
        before = before.play(m)
    assert playout_values(GAME.state_words([before]), 50, np.random.default_rng(0)).tolist() == [0.0]


@pytest.mark.parametrize("plies", [6, 14, 22])
def test_mid_game_win_rate_agrees_with_a_python_loop(plies: int) -> None:
    state = random_state(plies * 31, plies)
    assert not state.is_terminal
    n = 3000
    vec = playout_values(GAME.state_words([state]), 20000, np.random.default_rng(plies))[0]
    pyrng = random.Random(plies)
    ref = np.mean([python_playout(state, pyrng) for _ in range(n)])
    # The mean of +-1 outcomes has std <= 1/sqrt(n); allow 4 sigma of the smaller sample.
    assert abs(vec - ref) < 4 / np.sqrt(n)


def test_playout_values_shape_and_range() -> None:
    states = [random_state(s, 10) for s in range(5)]
    states = [s for s in states if not s.is_terminal]
    values = playout_values(GAME.state_words(states), 8, np.random.default_rng(0))
    assert values.shape == (len(states),)
    assert np.all(np.abs(values) <= 1.0)
    with pytest.raises(ValueError, match="rollouts must be >= 1, got 0"):
        playout_values(GAME.state_words(states), 0, np.random.default_rng(0))


def test_the_rollout_evaluator_values_a_position_as_a_python_loop_of_playouts() -> None:
    from app.games.search.evaluators import RolloutEvaluator

    state = random_state(99, 12)
    evaluator = RolloutEvaluator(GAME, rollouts_per_leaf=1500, rng=np.random.default_rng(5))
    pyrng = random.Random(5)
    slow = np.mean([python_playout(state, pyrng) for _ in range(1500)])
    priors, fast = evaluator.evaluate([state])
    assert abs(slow - fast[0]) < 4 * np.sqrt(2 / 1500)
    assert np.allclose(priors[0], state.legal_mask() / state.legal_mask().sum())
