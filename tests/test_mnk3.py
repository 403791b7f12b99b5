"""The three-player m,n,k game (app/games/mnk3.py): rules, returns of three, notation,
symmetries, and its compiled batch form (app/games/mnk3_arrays.py) against the object rules
on random games."""

from __future__ import annotations

import random

import numpy as np
import pytest

from app.games import IllegalMoveError, ParseError
from app.games.mnk3 import MNK3, MNK3State
from app.games.mnk3_arrays import after, finished, legal, legal_actions, play, ply_of, returns_of, terminal, to_move

GAME = MNK3()


def random_states(seed: int, games: int = 1) -> list[MNK3State]:
    """Every position of `games` random games."""
    rng = random.Random(seed)
    out = []
    for _ in range(games):
        state = GAME.initial_state()
        out.append(state)
        while not state.is_terminal:
            state = state.play(rng.choice(state.legal_moves()))
            out.append(state)
    return out


def test_seats_rotate_and_a_row_of_four_wins_with_returns_of_three() -> None:
    # Seat 0 (a) builds row 1 a1..d1 while seats 1 and 2 play elsewhere.
    state = GAME.parse("a1 a2 a3 b1 b2 b3 c1 c2 c3")
    assert state.to_move == 0 and not state.is_terminal
    won = state.play(GAME.cell_of("d1"))
    assert won.is_terminal and won.winner == 0 and won.legal_moves() == []
    assert list(won.returns()) == [1.0, -0.5, -0.5] and won.returns().sum() == 0.0
    assert won.terminal_value() == -0.5  # seat 1 is to move, and lost
    assert won.board_text().splitlines()[0] == "aaaa.."


def test_columns_and_both_diagonals_win_and_three_do_not() -> None:
    # Seats play in turn 0, 1, 2: seat 0 takes b1..b4 (a column), seats 1 and 2 three each.
    three = GAME.parse("b1 a1 f1 b2 a2 f2 b3 a3 f3")
    assert not three.is_terminal and three.winner is None
    column = three.play(GAME.cell_of("b4"))
    assert column.is_terminal and column.winner == 0
    diag = GAME.parse("a1 f1 f2 b2 e1 e2 c3 d1 d2 d4")
    assert diag.is_terminal and diag.winner == 0
    anti = GAME.parse("a6 f1 a1 b5 f2 a2 c4 f3 b1 d3")
    assert anti.is_terminal and anti.winner == 0


def test_a_full_board_without_a_line_is_a_draw() -> None:
    # Rows repeat a pattern in which no seat has four in any line.
    rows = ["aabbcc", "bbccaa", "ccaabb", "aabbcc", "bbccaa", "ccaabb"]
    cells = tuple("abc".index(ch) for row in rows for ch in row)
    state = MNK3State(cells, tuple(range(36)), None)
    assert state.is_terminal and state.winner is None and list(state.returns()) == [0.0, 0.0, 0.0]
    words = GAME.state_words([state])[0]
    assert finished(*words) and list(returns_of(*words)) == [0.0, 0.0, 0.0]


def test_illegal_moves_and_bad_text_raise_typed_errors() -> None:
    state = GAME.parse("c3")
    with pytest.raises(IllegalMoveError, match="taken"):
        state.play(GAME.cell_of("c3"))
    with pytest.raises(IllegalMoveError, match="cells are"):
        state.play(36)
    with pytest.raises(ParseError, match="no cell"):
        GAME.parse("c3 g7")
    with pytest.raises(ParseError, match="taken"):
        GAME.parse("c3 c3")
    over = GAME.parse("a1 a2 a3 b1 b2 b3 c1 c2 c3 d1")
    with pytest.raises(IllegalMoveError, match="over"):
        over.play(GAME.cell_of("f6"))


def test_text_round_trips_and_symmetries_keep_the_rules() -> None:
    for state in random_states(5, games=3):
        again = GAME.parse(state.to_text())
        assert again == state and again.to_text() == state.to_text()
    for state in random_states(6, games=2)[::3]:
        images = GAME.symmetries(state.planes(), state.legal_mask().astype(np.float32))
        assert len(images) == 8 and np.array_equal(images[0][0], state.planes())
        for perm, (planes, policy) in zip(GAME.cell_perms, images):
            cells = [-1] * 36
            for c in range(36):
                cells[int(perm[c])] = state.cells[c]
            image = MNK3State(tuple(cells), state.moves, state.winner)
            assert np.array_equal(planes, image.planes())
            assert np.array_equal(policy.astype(bool), image.legal_mask())


def test_the_compiled_rules_match_the_object_rules_on_random_games() -> None:
    states = random_states(11, games=40)
    assert sum(s.is_terminal and s.winner is None for s in states) < 40  # most games are won
    words = GAME.state_words(states)
    assert words.dtype == np.uint64 and words.shape == (len(states), 3)
    assert np.array_equal(GAME.words_planes(words), np.stack([s.planes() for s in states]))
    assert np.array_equal(GAME.words_legal_masks(words), np.stack([s.legal_mask() for s in states]))
    for state, w in zip(states, words):
        assert finished(*w) == state.is_terminal and to_move(w, state.ply) == state.to_move
        assert ply_of(w) == state.ply
        assert legal_actions(*w) == sum(1 << a for a in state.legal_moves())
        returns = np.full(3, 9.0)
        assert terminal(w, state.ply, returns) == state.is_terminal
        if state.is_terminal:
            assert np.array_equal(returns_of(*w), state.returns()) and np.array_equal(returns, state.returns())
            continue
        moves = np.zeros(36, dtype=np.uint8)
        assert legal(w, state.ply, moves) == len(state.legal_moves())
        assert np.array_equal(moves.astype(bool), state.legal_mask())
        for action in state.legal_moves()[::5]:
            child = GAME.state_words([state.play(action)])[0]
            assert tuple(int(x) for x in after(*w, action)) == tuple(int(x) for x in child)
            out = np.zeros(3, dtype=np.uint64)
            play(w, action, out)
            assert np.array_equal(out, child)


def test_the_start_up_check_passes_the_shipped_game() -> None:
    from app.games import get_game
    from app.games.checks import check_game

    assert get_game("mnk3").value_size == 3 and not get_game("mnk3").solver_proofs
    check_game(get_game("mnk3"))  # raises GameError at the first thing wrong


def test_self_play_stores_three_player_games_with_every_seat_winning(tmp_path) -> None:
    """The node's self-play (no model: uniform priors) on the three-player game: each seat's
    win is tallied, seat 2's too (a two-seat tally once crashed the self-play daemon on it)."""
    from app.config import Settings
    from app.db.replay_db import ReplayDB
    from app.games.train.selfplay import run_selfplay

    base = Settings()
    settings = base.model_copy(update={"node": base.node.model_copy(update={"game": "mnk3"}),
                                       "selfplay": base.selfplay.model_copy(update={"concurrent_games": 24})})
    summary = run_selfplay(24, 4, tmp_path / "games.db", workers=0, seed=3, settings=settings)
    assert summary.games == 24
    db = ReplayDB(tmp_path / "games.db")
    try:
        winners = [g.winner for g in db.iter_games()]
    finally:
        db.close()
    assert len(winners) == 24 and {0, 1, 2} <= set(winners)
