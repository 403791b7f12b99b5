"""Game rules behind one small interface; `get_game(name)` is the only way in from above."""

from app.games.base import Game, GameError, GameState, IllegalMoveError, ParseError, result_scale
from app.games.connect4 import Connect4
from app.games.mnk3 import MNK3
from app.games.othello import Othello

_GAMES: dict[str, type[Game]] = {"connect4": Connect4, "othello": Othello, "mnk3": MNK3}


def get_game(name: str = "connect4") -> Game:
    """The game registered under `name`; a clear error lists the known ones."""
    try:
        return _GAMES[name]()
    except KeyError:
        raise GameError(f"unknown game {name!r}; known games: {sorted(_GAMES)}") from None


__all__ = ["Game", "GameError", "GameState", "IllegalMoveError", "ParseError", "get_game", "result_scale"]
