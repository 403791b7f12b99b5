"""Othello 6x6's compiled batch form (app/games/othello_arrays.py) gives what `OthelloState`
gives, on every position of random games: legal actions (pass included), the position after
each, the end and each seat's result, and a batch's planes and legal masks."""

from __future__ import annotations

import random

import numpy as np

from app.games.othello import Othello, OthelloState
from app.games.othello_arrays import after, finished, legal, legal_actions, play, ply_of, returns_of, terminal, to_move

GAME = Othello()


def random_states(seed: int, games: int) -> list[OthelloState]:
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        state = GAME.initial_state()
        out.append(state)
        while not state.is_terminal:
            state = state.play(rng.choice(state.legal_moves()))
            out.append(state)
    return out


def test_the_compiled_rules_match_the_object_rules_on_random_games() -> None:
    states = random_states(1, games=30)
    assert any(36 in s.legal_moves() for s in states)  # the games hold passes
    words = GAME.state_words(states)
    assert words.dtype == np.uint64 and words.shape == (len(states), 3)
    for state, w in zip(states, words):
        assert int(w[2]) == state.to_move == to_move(w, state.ply)
        assert ply_of(w) == sum(a != 36 for a in state.moves)  # the stone moves
        assert finished(w[0], w[1]) == state.is_terminal
        assert legal_actions(w[0], w[1]) == sum(1 << a for a in state.legal_moves())
        returns = np.full(2, 9.0)
        assert terminal(w, state.ply, returns) == state.is_terminal
        if state.is_terminal:
            assert np.array_equal(returns_of(*w), state.returns()) and np.array_equal(returns, state.returns())
            continue
        moves = np.zeros(37, dtype=np.uint8)
        assert legal(w, state.ply, moves) == len(state.legal_moves())
        assert np.array_equal(moves.astype(bool), state.legal_mask())
        for action in state.legal_moves():
            child = GAME.state_words([state.play(action)])[0]
            assert tuple(int(x) for x in after(*w, action)) == tuple(int(x) for x in child)
            out = np.zeros(3, dtype=np.uint64)
            play(w, action, out)
            assert np.array_equal(out, child)


def test_a_batch_has_each_states_planes_and_legal_mask() -> None:
    states = random_states(2, games=10)
    words = GAME.state_words(states)
    assert np.array_equal(GAME.words_planes(words), np.stack([s.planes() for s in states]))
    assert np.array_equal(GAME.words_legal_masks(words), np.stack([s.legal_mask() for s in states]))
    assert np.array_equal(GAME.stacked_planes(states), GAME.words_planes(words))


def test_the_start_up_check_passes_the_shipped_game() -> None:
    from app.games import get_game
    from app.games.checks import check_game

    check_game(get_game("othello"))  # raises GameError at the first thing wrong
