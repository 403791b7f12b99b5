"""Connect Four's batch form (app/games/connect4_arrays.py) gives what `Connect4State` gives:
the compiled rules the search creates its nodes with (drop a stone, game over, the one-ply
threat check) and the batch's network input and legal masks, on random positions."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from app.games import get_game, result_scale
from app.games.connect4_arrays import legal_bits, node_facts, play
from tests.test_playouts import random_state

GAME = get_game("connect4")


def bits(columns: list[int]) -> int:
    return sum(1 << c for c in columns)


def expected_facts(state, discount: float, threat_check: bool) -> tuple[float, int, int]:
    """The per-tree search's node creation of e1e3464, from the state's own rules."""
    if state.is_terminal:
        return state.terminal_value(discount), -1, 0
    if not threat_check:
        return math.nan, -1, -1
    wins, safe = state.threat_outlook()
    if wins:
        return result_scale(state.ply + 1, state.max_plies, discount), bits(wins), -1
    if not safe:
        return -result_scale(state.ply + 2, state.max_plies, discount), -1, -1
    return math.nan, bits(safe), -1


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10**9), st.integers(0, 42), st.sampled_from([0.0, 0.5, 0.75]), st.booleans())
def test_node_facts_and_moves_match_the_state(seed: int, plies: int, discount: float, threat_check: bool) -> None:
    state = random_state(seed, plies)
    [words] = GAME.state_words([state])
    proven, moves, legal = node_facts(words[0], words[1], state.ply, discount, threat_check)
    want = expected_facts(state, discount, threat_check)
    assert (moves, legal) == want[1:]
    assert (math.isnan(proven) and math.isnan(want[0])) or proven == want[0]
    if state.is_terminal:
        return
    assert legal_bits(words[1]) == bits(state.legal_moves())
    for move in state.legal_moves():
        child = state.play(move)
        assert tuple(int(w) for w in play(words[0], words[1], move)) == (child.position, child.mask)


def test_a_batch_has_each_states_planes_and_legal_mask() -> None:
    states = [random_state(s, p) for s in range(40) for p in (0, 7, 20, 41)]
    assert any(s.is_terminal for s in states) and not all(s.is_terminal for s in states)
    words = GAME.state_words(states)
    assert words.dtype == np.uint64 and words.shape == (len(states), 2)
    assert np.array_equal(GAME.words_planes(words), np.stack([s.planes() for s in states]))
    assert np.array_equal(GAME.words_legal_masks(words), np.stack([s.legal_mask() for s in states]))
