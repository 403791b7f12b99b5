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
