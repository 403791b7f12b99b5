"""A user's game by import path: each bad input is one clear line naming the config key (issue
51): a path that does not import, a class that lacks a part, rules that disagree with
themselves (the start-up check's random playouts); a good one loads and is searched."""

from __future__ import annotations

import numpy as np
import pytest

from app.games.search.evaluators import UniformEvaluator
from app.games.search.mcts import SearchForest
from app.config import SearchConfig
from app.games import GameError, get_game
from app.games.checks import check_game

B = "tests.user_games.broken_games"


@pytest.mark.parametrize("spec, says", [
    ("no.such.module:Game", "does not import"),
    ("tests.user_games.tictactoe:NoSuchClass", "has no 'NoSuchClass'"),
    ("tests.user_games.tictactoe:TicTacToeState", "not a subclass of app.games.Game"),
    ("tictactoe", "unknown game"),
    (f"{B}:Abstract", "cannot be made"),
    (f"{B}:NoRules", "does not import"),
    (f"{B}:WrongSize", "NUM_ACTIONS is 9, the game says 10"),
    (f"{B}:ReturnsEarly", "returns() answered before the end"),
    (f"{B}:RaisesOnLegal", "legal action 4 raised RuntimeError"),
    (f"{B}:TooShort", "MAX_PLIES is 9, the game says 5"),
    (f"{B}:ProofsNotZeroSum", "solver_proofs on a two-seat game whose returns do not cancel"),
])
def test_a_bad_game_is_one_line_naming_the_key(spec: str, says: str) -> None:
    with pytest.raises(GameError) as err:
        get_game(spec)
    text = str(err.value)
    assert says in text and "\n" not in text
    if spec != "tictactoe":
        assert text.startswith("node.game: ")


def test_the_shipped_game_and_the_user_game_pass_the_check_and_search() -> None:
    check_game(get_game("connect4"))
    game = get_game("tests.user_games.tictactoe:TicTacToe")
    assert game.name == "tests.user_games.tictactoe:TicTacToe" and game.value_size == 1
    cfg = SearchConfig()
    forest = SearchForest.for_search(game, cfg)
    slot = forest.add(game.parse("1425"))  # X: 1, 2 (cells 0, 1); O: 4, 5: X wins at cell 2 now
    [result] = forest.search([slot], UniformEvaluator(game), 64, cfg, np.random.default_rng(0))
    assert result.proven is not None and result.proven > 0 and result.best_action == 2
