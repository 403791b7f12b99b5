"""Othello's rules (app/games/othello.py) against known facts, and its exact endgame search
(app/games/othello_solver.py) against hand-checked endgames and a plain minimax."""

from __future__ import annotations

import random

import numpy as np
import pytest

from app.games import GameError, IllegalMoveError, ParseError
from app.games.othello import BLACK, WHITE, Othello, OthelloState
from app.games.othello_solver import EndgameSolver

GAME = Othello()


def perft(state: OthelloState, depth: int) -> int:
    if depth == 0 or state.is_terminal:
        return 1
    return sum(perft(state.play(a), depth - 1) for a in state.legal_moves())


def random_game_state(seed: int, empties: int) -> OthelloState:
    """A position of a random game with `empties` empty cells or fewer (not finished)."""
    rng = random.Random(seed)
    while True:
        state = GAME.initial_state()
        while not state.is_terminal and 36 - (state.own | state.opp).bit_count() > empties:
            state = state.play(rng.choice(state.legal_moves()))
        if not state.is_terminal:
            return state


def test_8x8_move_paths_match_the_published_perft_counts() -> None:
    """The same rule code on the standard board: 4, 12, 56, 244, 1396, 8200 move paths."""
    start = Othello(8).initial_state()
    assert [perft(start, d) for d in range(1, 7)] == [4, 12, 56, 244, 1396, 8200]


def test_the_6x6_opening() -> None:
    start = GAME.initial_state()
    assert start.board_text().splitlines()[2:4] == ["..ox..", "..xo.."]
    assert start.to_move == BLACK and start.counts() == (2, 2)
    assert [GAME.action_to_text(a) for a in start.legal_moves()] == ["c2", "b3", "e4", "d5"]
    for action in start.legal_moves():  # each opening move flips exactly one stone
        after = start.play(action)
        assert after.counts() == (4, 1) and after.to_move == WHITE and len(after.legal_moves()) == 3
    assert [perft(start, d) for d in range(1, 5)] == [4, 12, 56, 244]


def test_illegal_moves_and_bad_text_raise_typed_errors() -> None:
    start = GAME.initial_state()
    with pytest.raises(IllegalMoveError, match="taken"):
        start.play(GAME.cell_of("c3"))
    with pytest.raises(IllegalMoveError, match="flips no stone"):
        start.play(GAME.cell_of("a1"))
    with pytest.raises(IllegalMoveError, match="pass is legal only"):
        start.play(36)
    with pytest.raises(IllegalMoveError, match="actions are"):
        start.play(37)
    with pytest.raises(ParseError, match="no cell"):
        GAME.parse("c2 z9")
    with pytest.raises(ParseError, match="flips no stone"):
        GAME.parse("c2 a1")
    with pytest.raises(GameError):
        Othello(7)


def test_text_round_trips_through_parse() -> None:
    rng = random.Random(3)
    state = GAME.initial_state()
    while not state.is_terminal:
        state = state.play(rng.choice(state.legal_moves()))
    again = GAME.parse(state.to_text())
    assert again == state and again.to_text() == state.to_text() and again.ply == state.ply


def test_a_player_without_a_move_passes_and_the_game_ends_when_neither_can() -> None:
    # Black (x) to move has no cell that brackets white; white can take a1 (b1 x, c1 o).
    state = GAME.from_board("""
        .xoooo
        oooooo
        oooooo
        oooooo
        oooooo
        oooooo""", BLACK)
    assert not state.is_terminal and state.legal_moves() == [36]
    assert state.legal_mask().sum() == 1 and state.legal_mask()[36]
    passed = state.play(36)
    assert passed.to_move == WHITE and passed.legal_moves() == [GAME.cell_of("a1")]
    with pytest.raises(IllegalMoveError):
        passed.play(36)  # white has a move, so may not pass
    end = passed.play(GAME.cell_of("a1"))
    # All stones white: neither side can move, the game is over.
    assert end.is_terminal and end.legal_moves() == [] and end.counts() == (0, 36)
    assert end.winner == WHITE and list(end.returns()) == [-1.0, 1.0]
    assert end.terminal_value() == -1.0  # black is to move, and lost
    with pytest.raises(IllegalMoveError, match="over"):
        end.play(3)


def test_a_drawn_full_board() -> None:
    state = GAME.from_board("\n".join(["xxxooo"] * 6), BLACK)
    assert state.is_terminal and state.winner is None and list(state.returns()) == [0.0, 0.0]


def test_symmetries_map_positions_to_positions_with_the_same_rules() -> None:
    for seed in range(20):
        state = random_game_state(seed, 20)
        images = GAME.symmetries(state.planes(), state.legal_mask().astype(np.float32))
        assert len(images) == 8 and np.array_equal(images[0][0], state.planes())
        for perm, (planes, policy) in zip(GAME.cell_perms, images):
            own = sum(1 << int(perm[c]) for c in range(36) if state.own >> c & 1)
            opp = sum(1 << int(perm[c]) for c in range(36) if state.opp >> c & 1)
            image = OthelloState(own, opp, state.to_move, (), 6)
            assert np.array_equal(planes, image.planes())
            assert np.array_equal(policy.astype(bool), image.legal_mask())


def minimax_margin(state: OthelloState) -> int:
    """The exact margin by plain minimax over the object rules (no pruning, no table)."""
    if state.is_terminal:
        own, opp = state.own.bit_count(), state.opp.bit_count()
        empties = 36 - own - opp
        return own - opp + (empties if own > opp else -empties if own < opp else 0)
    return max(-minimax_margin(state.play(a)) for a in state.legal_moves())


def test_the_solver_on_hand_checked_endgames() -> None:
    solver = EndgameSolver()
    # One empty cell; a1 flips b1..e1 (bracketed by f1): the whole board turns black.
    one = GAME.from_board(".oooox\n" + "\n".join(["xxxxxx"] * 5), BLACK)
    assert one.legal_moves() == [0] and solver.move_scores(one) == {0: 36}
    # Two empty cells, a1 and f1, white to move; every stone is black but c1, d1 and e1.
    two = GAME.from_board("""
        .xooo.
        xxxxxx
        xxxxxx
        xxxxxx
        xxxxxx
        xxxxxx""", WHITE)
    scores = solver.move_scores(two)
    assert set(scores) == {0}  # f1 brackets nothing for white (no white stone beyond e1)
    # After white a1 (flips b1) row 1 is o o o o o .: black's f1 ends on a1 at the edge, and
    # white's f1 meets only black to the edges, so the game ends: 5 white, 30 black, the
    # empty cell to black, margin for white 5 - 31 = -26.
    assert scores[0] == -26 and minimax_margin(two) == -26
    # The pass position above: black passes, white takes a1 and wins 36-0.
    pass_case = GAME.from_board(".xoooo\n" + "\n".join(["oooooo"] * 5), BLACK)
    assert solver.move_scores(pass_case) == {36: -36}


@pytest.mark.parametrize("seed", range(12))
def test_the_solver_agrees_with_plain_minimax(seed: int) -> None:
    state = random_game_state(100 + seed, 7)
    solver = EndgameSolver()
    scores = solver.move_scores(state)
    assert scores == {a: -minimax_margin(state.play(a)) for a in state.legal_moves()}
    top = max(scores.values())
    assert solver.best_moves(state) == [a for a in sorted(scores) if scores[a] == top]
    assert set(solver.best_moves(state)) <= set(solver.outcome_moves(state))


def test_random_playouts_keep_the_rules_consistent() -> None:
    rng = random.Random(7)
    for _ in range(30):
        state = GAME.initial_state()
        while not state.is_terminal:
            black, white = state.counts()
            legal = state.legal_moves()
            assert legal and state.legal_mask().sum() == len(legal) and state.ply <= state.max_plies
            action = rng.choice(legal)
            after = state.play(action)
            b2, w2 = after.counts()
            if action == 36:
                assert (b2, w2) == (black, white) and after.to_move != state.to_move
            else:  # one stone placed, at least one flipped, the mover gains 1 + 2 * flips
                assert b2 + w2 == black + white + 1
                gained = (b2 - black) if state.to_move == BLACK else (w2 - white)
                assert gained >= 2
            state = after
        assert (state.winner is None) == (state.returns() == 0).all()
        assert state.returns().sum() == 0.0
