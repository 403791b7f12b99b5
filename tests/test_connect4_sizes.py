"""Connect Four at any width x height that fits the bitboard (issue 51): each size is the same
rules at another size, passes the start-up check, is searched, and a size that does not fit
is one line naming the key."""

from __future__ import annotations

import numpy as np
import pytest

from app.games.search.evaluators import UniformEvaluator
from app.games.search.heuristic import heuristic_move
from app.games.search.mcts import SearchForest
from app.config import SearchConfig
from app.games import GameError, get_game
from app.games.checks import check_game


@pytest.mark.parametrize("name, actions, shape", [("connect4_8x7", 8, (3, 7, 8)), ("connect4_5x4", 5, (3, 4, 5))])
def test_a_board_size_is_the_same_rules_checked_and_searched(name: str, actions: int, shape: tuple) -> None:
    game = get_game(name)
    assert (game.name, game.num_actions, game.plane_shape, game.max_plies) == (name, actions, shape, shape[1] * shape[2])
    assert game.scored_positions is None  # only 7x6 ships a solved set
    check_game(game, playouts=4)
    state = game.parse("1122334"[: 2 * 3])  # first player: columns 1, 2, 3 on the bottom row
    assert heuristic_move(state, 2, np.random.default_rng(0), name) == 3  # completes four in column 4
    cfg = SearchConfig()
    forest = SearchForest.for_search(game, cfg)
    [result] = forest.search([forest.add(state)], UniformEvaluator(game), 16, cfg, np.random.default_rng(0))
    assert result.proven is not None and result.proven > 0 and result.best_action == 3


@pytest.mark.parametrize("name, says", [("connect4_9x7", "needs 72 bits"), ("connect4_3x3", "no room for four"),
                                        ("connect4_10x4", "width must be 1..9")])
def test_a_size_that_does_not_fit_is_refused(name: str, says: str) -> None:
    with pytest.raises(GameError) as err:
        get_game(name)
    assert str(err.value).startswith(f"node.game: {name}: ") and says in str(err.value)
