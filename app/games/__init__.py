"""The game workload's home; this package itself is its core: game rules behind one small
interface, and `get_game(name)` the only way in from above.

    *.py         the `Game` interface (base.py, array_rules.py), its start-up check (checks.py) and
                 the shipped games: Connect Four at any size, Othello 6x6, mnk3 (three players)
    search/      how a network plays a game: the net, the array search compiled per game, players
    train/       how it learns: self-play, export, the torchrun trainer, gauntlet, Elo, promotion
    workload/    the pipeline steps the daemons run (the seam's game side)

Imports run downward, as in app/lm: workload -> train -> search -> these modules; importing this
package loads no torch (app/config asks it for `get_game`).

`name` is a registered game ("connect4", the default; "connect4_<w>x<h>" for another board
size, app/games/connect4_sizes.py) or a user's game by import path,
"package.module:ClassName" (a `Game` subclass written outside this repository). A user's game
is checked at its first load in a process (`app.games.checks.check_game`: every required
part, and its rules on random playouts), and a failure is one GameError line naming the
config key. The game's `name` is the string it was asked by, so a model, a game record or a
gauntlet task that names it loads the same game in any process.
"""

from __future__ import annotations

import importlib

from app.games.base import Game, GameError, GameState, IllegalMoveError, ParseError, result_scale
from app.games.checks import check_game
from app.games.connect4 import Connect4
from app.games.connect4_sizes import SIZED_NAME, sized_connect4
from app.games.mnk3 import MNK3
from app.games.othello import Othello

_GAMES: dict[str, type[Game]] = {"connect4": Connect4, "othello": Othello, "mnk3": MNK3}
_LOADED: dict[str, Game] = {}
GAME_KEY = "node.game"  # the config key that names the game
DEFAULT_GAME = "connect4"  # what a node plays unless node.game says otherwise


def load_game_class(spec: str, key: str = GAME_KEY) -> type[Game]:
    """The class a "package.module:ClassName" names; GameError naming `key` when it does not
    import or is no Game."""
    module_path, _, attr = spec.partition(":")
    if not module_path or not attr:
        raise GameError(f"{key}: {spec!r} is neither a known game {sorted(_GAMES)} nor 'package.module:ClassName'")
    try:
        module = importlib.import_module(module_path)
    except Exception as exc:  # noqa: BLE001 - any failure to import is the user's path
        raise GameError(f"{key}: {spec!r} does not import: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        raise GameError(f"{key}: {spec!r}: module {module_path!r} has no {attr!r}")
    if not (isinstance(cls, type) and issubclass(cls, Game)):
        raise GameError(f"{key}: {spec!r} is not a subclass of app.games.Game")
    return cls


def get_game(name: str = DEFAULT_GAME, key: str = GAME_KEY) -> Game:
    """The game registered under `name`, or a user's game by import path; a clear error lists
    the known ones or names what is wrong with the user's."""
    if name in _LOADED:
        return _LOADED[name]
    if name in _GAMES:
        game = _GAMES[name]()
    elif SIZED_NAME.match(name):
        width, height = (int(x) for x in SIZED_NAME.match(name).groups())  # type: ignore[union-attr]
        game = sized_connect4(width, height)
    elif ":" in name:
        cls = load_game_class(name, key)
        try:
            game = cls()
        except TypeError as exc:  # abstract methods left unwritten, or a constructor with arguments
            raise GameError(f"{key}: {name!r} cannot be made: {exc}") from None
        game.name = name
        check_game(game, key)
    else:
        raise GameError(f"unknown game {name!r}; known games: {sorted(_GAMES)}, connect4_<w>x<h> or "
                        f"'package.module:ClassName'")
    _LOADED[name] = game
    return game


__all__ = ["DEFAULT_GAME", "Game", "GameError", "GameState", "IllegalMoveError", "ParseError", "get_game", "result_scale"]
