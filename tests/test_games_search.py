"""The one array search (app/games/search/search_forest.py, compiled per game) on the two new games:
Othello's passes and proofs against its exact endgame search, and the three-player game's
vector values (each node choosing by its mover's entry)."""

from __future__ import annotations

import numpy as np

from app.games.search.evaluators import RolloutEvaluator, UniformEvaluator
from app.games.search.search_forest import SearchForest
from app.config.pipeline import SearchConfig
from app.games import get_game
from app.games.othello import BLACK, WHITE
from app.games.othello_solver import EndgameSolver

CFG = SearchConfig(length_discount=0.0, threat_check=False)


def best_by_search(game, states, sims: int) -> list:
    forest = SearchForest.for_search(game, CFG, trees=len(states))
    slots = [forest.add(s) for s in states]
    return forest.search(slots, UniformEvaluator(game), sims, CFG, np.random.default_rng(0))


def test_othello_search_passes_and_plays_exact_endgames() -> None:
    game = get_game("othello")
    forced_pass = game.from_board(".xoooo\n" + "\n".join(["oooooo"] * 5), BLACK)
    # Four empty cells, white to move; the exact search says which moves keep the best result.
    endgame = game.from_board("""
        .oooo.
        xxxxoo
        xxoxxo
        xxxxxx
        oxxxxx
        ..xxxo""", WHITE)
    solver = EndgameSolver()
    results = best_by_search(game, [forced_pass, endgame], 3000)
    assert int(np.argmax(results[0].counts)) == 36 and results[0].proven == -1.0  # a pass, proven lost
    assert int(np.argmax(results[1].counts)) in solver.outcome_moves(endgame)
    want = np.sign(solver.value(endgame))
    assert results[1].proven == want  # four empties: the solver-search proves the result


def test_three_player_search_takes_a_win_and_values_by_seat() -> None:
    game = get_game("mnk3")
    state = game.parse("a1 a2 a3 b1 b2 b3 c1 c2 c3")  # seat 0 to move, a1 b1 c1 taken
    [result] = best_by_search(game, [state], 400)
    assert int(np.argmax(result.counts)) == game.cell_of("d1")
    assert result.root_value > 0.5  # the mover's entry of the vector: a win is +1
    assert result.proven is None  # N > 2: no proofs unless the game says its results allow them
    # a game that says so (the same rules and compiled search): the win on the spot is proven,
    # the root taking the winning child's vector, so the mover's entry is exactly a win's
    proving = type("ProvingMNK3", (type(game),), {"solver_proofs": True})()
    [proved] = best_by_search(proving, [state], 400)
    assert int(np.argmax(proved.counts)) == game.cell_of("d1")
    assert proved.proven == 1.0 and proved.child_proven[game.cell_of("d1")] == 1.0


def exact_value(state, seat: int) -> float:
    """`seat`'s return under max^n play (each mover maximises its own entry; ties by move order)."""
    if state.is_terminal:
        return float(state.returns()[seat])
    children = [state.play(a) for a in state.legal_moves()]
    best = max(children, key=lambda c: exact_value(c, state.to_move))  # the first of equals, as the search
    return exact_value(best, seat)


def test_three_player_proofs_take_the_best_child_when_every_child_is_proven() -> None:
    """N > 2 with proofs on: a node none of whose moves wins on the spot is proven once all its
    children are, with the vector of the best of them for its mover (here a position two plies
    from a full board: the mover's two moves, each answered by the last cell)."""
    game = type("ProvingMNK3", (type(get_game("mnk3")),), {"solver_proofs": True})()
    rng = np.random.default_rng(7)
    exact: dict[int, float] = {}
    while len(set(exact.values())) < 2:  # random games to two empty cells where no move of the
        state = game.initial_state()     # mover wins at once and one move is better than the other
        while not state.is_terminal and len(state.legal_moves()) > 2:
            state = state.play(int(rng.choice(state.legal_moves())))
        if not state.is_terminal and not any(state.play(a).is_terminal for a in state.legal_moves()):
            exact = {a: exact_value(state.play(a), state.to_move) for a in state.legal_moves()}
    [result] = best_by_search(game, [state], 400)
    assert result.proven == max(exact.values()), (exact, result.proven)
    for a, value in exact.items():
        assert result.child_proven[a] == value, (a, exact, result.child_proven)


def test_random_playouts_give_values_in_the_networks_convention() -> None:
    """The rollout evaluator (the search kernel's playouts over the game's rules, from
    `ply_of`) on positions whose every playout ends alike."""
    rng = np.random.default_rng(0)
    othello = get_game("othello")
    one_move = othello.from_board(".oooox\n" + "\n".join(["xxxxxx"] * 5), BLACK)  # a1 wins 36-0
    _, values = RolloutEvaluator(othello, 5, rng).evaluate([one_move])
    assert values.shape == (1,) and values[0] == 1.0  # the mover's mean return
    mnk3 = get_game("mnk3")
    # Seat 0 has just won (a1 b1 c1 d1); seat 1 would move: entry k is seat (1 + k) % 3.
    won = mnk3.parse("a1 a2 a3 b1 b2 b3 c1 c2 c3 d1")
    _, values = RolloutEvaluator(mnk3, 3, rng).evaluate([won])
    assert values.shape == (1, 3) and list(values[0]) == [-0.5, -0.5, 1.0]


def test_old_kernel_files_are_pruned_and_recent_or_other_games_kept(tmp_path) -> None:
    """A game's compiled module under an old hash goes once unused for PRUNE_AFTER_S (with
    numba's cache files of it); a recent one (another program version may use it), the current
    one and another game's whose module name extends this one's stay."""
    import os
    import time

    from app.games.search.kernel_build import PRUNE_AFTER_S, prune_old

    prefix = "search_kernel_app_games_mnk3_arrays_"
    (tmp_path / "__pycache__").mkdir()
    names = {"current": prefix + "0" * 16, "old": prefix + "1" * 16, "recent": prefix + "2" * 16,
             "other game": prefix + "x_" + "3" * 16}
    for name in names.values():
        (tmp_path / f"{name}.py").write_text("")
        (tmp_path / "__pycache__" / f"{name}.select-212.py311.nbi").write_text("")
    long_ago = time.time() - PRUNE_AFTER_S - 60
    for key in ("current", "old", "other game"):
        os.utime(tmp_path / f"{names[key]}.py", (long_ago, long_ago))
    assert prune_old(tmp_path, prefix, names["current"]) == [names["old"]]
    left = sorted(p.name.split(".")[0] for p in tmp_path.glob("*.py"))
    assert left == sorted(n for k, n in names.items() if k != "old")
    assert sorted(p.name.split(".")[0] for p in (tmp_path / "__pycache__").iterdir()) == left
