"""Connect Four rules checked against facts no one here wrote: OEIS A212693 and Pons' positions."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.games import IllegalMoveError, ParseError, get_game
from app.games.base import GameState as GameStateRules
from app.games.connect4 import Connect4State, has_four
from app.games.train.solved_eval import load_positions

# OEIS A212693: number of distinct Connect Four positions after n plies.
A212693 = [1, 7, 49, 238, 1120, 4263, 16422, 54859, 184275]

GAME = get_game("connect4")


def test_position_counts_match_oeis_a212693() -> None:
    level = {GAME.initial_state()}
    counts = [1]
    for _ in range(len(A212693) - 1):
        level = {s.play(m) for s in level if not s.is_terminal for m in s.legal_moves()}
        counts.append(len(level))
    assert counts == A212693


def test_every_pons_position_replays_to_a_non_terminal_state(pons_dir) -> None:
    files = sorted(pons_dir.glob("Test_*"))
    assert files, f"no test files in {pons_dir}"
    lines = 0
    for path in files:
        for line in path.read_text().splitlines():
            moves, score = line.split()
            state = GAME.parse(moves)
            assert not state.is_terminal, f"{path.name}: {moves}"
            assert state.to_text() == moves
            assert state.ply == len(moves)
            assert -21 <= int(score) <= 21
            lines += 1
    assert lines == 6000


def test_vertical_horizontal_and_diagonal_wins() -> None:
    for moves, winner in [("1212121", 0), ("1122334", 0), ("12235334444", 0), ("1223343445", 1), ("122353344", None)]:
        state = GAME.parse(moves)
        assert state.winner == winner, moves
        assert state.is_terminal == (winner is not None)
    assert GAME.parse("71122334").winner == 1  # second player completes the bottom row
    assert GAME.parse("1212121").terminal_value() == -1.0  # the side to move has lost


def test_full_board_without_four_is_a_draw() -> None:
    # Columns filled in the pattern 1,2 / 3,4 / ... never lines up four (a known drawn filling).
    moves = "121212" "343434" "565656" "212121" "434343" "656565" "777777"
    state = GAME.parse(moves)
    assert state.ply == 42 and state.is_terminal and state.winner is None
    assert state.terminal_value() == 0.0
    assert state.legal_moves() == []


def test_illegal_moves_raise_typed_errors_naming_the_move() -> None:
    full = GAME.parse("111111")
    with pytest.raises(IllegalMoveError, match="column 1 is full") as info:
        full.play(0)
    assert info.value.move == 0 and info.value.state == "111111"
    with pytest.raises(IllegalMoveError, match="7"):
        GAME.initial_state().play(7)
    with pytest.raises(IllegalMoveError, match="over"):
        GAME.parse("1212121").play(3)
    with pytest.raises(ParseError, match="bad character '8'"):
        GAME.parse("448")
    with pytest.raises(ParseError, match="move 7"):
        GAME.parse("1111111")


def test_planes_are_from_the_side_to_move_view() -> None:
    after_one = GAME.parse("4").planes()
    assert after_one.shape == GAME.plane_shape
    assert after_one[1, 0, 3] == 1 and after_one[0].sum() == 0  # opponent's stone
    after_two = GAME.parse("44").planes()
    assert after_two[0, 0, 3] == 1 and after_two[1, 1, 3] == 1
    assert np.all(after_two[2] == 1)


def test_mirror_symmetry_maps_planes_and_policy() -> None:
    state = GAME.parse("1123")
    mirrored_state = GAME.parse("7765")
    policy = np.arange(7, dtype=np.float32)
    (p0, q0), (p1, q1) = GAME.symmetries(state.planes(), policy)
    assert np.array_equal(p0, state.planes()) and np.array_equal(q0, policy)
    assert np.array_equal(p1, mirrored_state.planes())
    assert list(q1) == list(policy[::-1])



@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=1, max_size=8))
def test_a_batch_of_planes_masks_and_mirrors_equals_them_one_state_at_a_time(seeds: list[int]) -> None:
    """Export and the network evaluator make planes, legal masks and images in one batch; they
    must be the per-state ones, terminal states included."""
    states = []
    for seed in seeds:  # random legal positions of random lengths, terminal ones too
        rng, state = np.random.default_rng(seed), GAME.initial_state()
        for _ in range(int(rng.integers(0, 42))):
            if state.is_terminal:
                break
            state = state.play(int(rng.choice(state.legal_moves())))
        states.append(state)
    planes = GAME.stacked_planes(states)
    assert planes.dtype == np.float32 and planes.shape == (len(states), *GAME.plane_shape)
    assert all(np.array_equal(planes[i], s.planes()) for i, s in enumerate(states))
    masks = GAME.stacked_legal_masks(states)
    assert masks.dtype == bool and np.array_equal(masks, np.stack([s.legal_mask() for s in states]))
    policy = np.random.default_rng(seeds[0]).random((len(states), GAME.num_actions), dtype=np.float32)
    batched = GAME.symmetries(planes, policy)
    for i, state in enumerate(states):
        one = GAME.symmetries(state.planes(), policy[i])
        assert all(np.array_equal(bp[i], p) and np.array_equal(bq[i], q) for (bp, bq), (p, q) in zip(batched, one))

@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_random_games_keep_their_invariants(seed: int) -> None:
    rng = random.Random(seed)
    state = GAME.initial_state()
    while not state.is_terminal:
        legal = state.legal_moves()
        assert list(np.flatnonzero(state.legal_mask())) == legal
        move = rng.choice(legal)
        wins = state.is_winning_move(move)
        state = state.play(move)
        assert wins == (state.winner is not None)
        assert bin(state.mask).count("1") == state.ply
        assert GAME.parse(state.to_text()) == state
    assert state.legal_moves() == []
    assert has_four(state.position ^ state.mask) == (state.winner is not None)


def test_key_identifies_position_not_move_order() -> None:
    assert GAME.parse("1234").key() == GAME.parse("3214").key()
    assert GAME.parse("1234").key() != GAME.parse("2143").key()
    assert isinstance(GAME.initial_state(), Connect4State)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_bitboard_threats_are_the_rules_one_ply_deep(seed: int) -> None:
    """Connect Four's bitboard winning/safe moves equal GameState's generic ones, which play
    every move and look at the result: along random games, every position."""
    rng = random.Random(seed)
    state = GAME.initial_state()
    while not state.is_terminal:
        wins, safe = state.threat_outlook()
        assert wins == GameStateRules.winning_moves(state)
        assert safe == GameStateRules.safe_moves(state)
        assert (wins, safe) == (state.winning_moves(), state.safe_moves())
        state = state.play(rng.choice(state.legal_moves()))
    assert state.threat_outlook() == ([], [])


def test_threats_agree_with_the_solver_on_every_scored_position(pons_dir) -> None:
    """A move that wins on the spot scores the quickest win there is; a move the threat check
    calls unsafe scores the quickest loss; and no best move is ever unsafe. That is what lets
    the search prove and prune by them without losing exactness."""
    positions = load_positions(pons_dir / "move_scores.txt")
    assert len(positions) == 931
    seen_win = seen_unsafe = 0
    for position in positions:
        moves, best = position.moves, position.best
        state = GAME.parse(moves)
        scores = {a: position.scores[a] for a in state.legal_moves()}
        quickest_win = 22 - (state.ply // 2 + 1)  # the mover's stones once it has played
        quickest_loss = -(22 - ((state.ply + 1) // 2 + 1))  # the opponent's, a ply later
        wins, safe = state.threat_outlook()
        assert wins == sorted(a for a, s in scores.items() if s == quickest_win), moves
        unsafe = [a for a in scores if a not in safe]
        assert all(scores[a] == quickest_loss for a in unsafe), moves
        if safe:
            assert all(a in safe for a, s in scores.items() if s == best), moves
        seen_win += bool(wins)
        seen_unsafe += bool(unsafe)
    assert seen_win > 0 and seen_unsafe > 100  # the file exercises both rules
