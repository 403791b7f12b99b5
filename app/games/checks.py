"""The start-up check of a game: every required part, and rules that agree with themselves.

A user's game (`node.game: "package.module:ClassName"`) is checked here before anything runs
on it, so a mistake is one line naming the key at start, not a wrong model hours later:

- parts: the facts (`name`, `num_players`, `num_actions`, `plane_shape`, `max_plies`,
  `words`, `rules_module`) with sane values, the compiled rules module with every name of its
  contract (app/games/array_rules.py) and constants equal to the game's;
- rules, on seeded random playouts: every legal action applied never raises, `returns()` only
  at the end (a GameError before) and a finite vector of N there, plies within `max_plies`,
  `to_move` a seat, `legal_mask` equal to `legal_moves`, planes of the stated shape; and the
  array form the search runs on says the same as the objects (words -> planes, legal masks,
  and the compiled `to_move`, `terminal`, `legal`, `play`).
"""

from __future__ import annotations

import numpy as np

from app.games.array_rules import load_rules
from app.games.base import Game, GameError

FACTS = ("name", "num_players", "num_actions", "plane_shape", "max_plies", "words", "rules_module")
PLAYOUTS = 12


def check_game(game: Game, key: str = "node.game", playouts: int = PLAYOUTS, seed: int = 0) -> None:
    """Raise GameError (one line, naming `key` and the game) at the first thing wrong."""
    where = f"{key}: {getattr(game, 'name', type(game).__name__)!r}"
    missing = [f for f in FACTS if not hasattr(game, f)]
    if missing:
        raise GameError(f"{where} lacks {', '.join(missing)} (app/games/base.py Game)")
    n, a = game.num_players, game.num_actions
    if not (isinstance(n, int) and n >= 1 and isinstance(a, int) and a >= 1 and isinstance(game.words, int)
            and game.words >= 1 and isinstance(game.max_plies, int) and game.max_plies >= 1
            and len(tuple(game.plane_shape)) == 3):
        raise GameError(f"{where}: num_players, num_actions, words, max_plies must be positive ints and "
                        f"plane_shape (channels, height, width), got {n}, {a}, {game.words}, {game.max_plies}, "
                        f"{game.plane_shape}")
    if n == 2 and game.solver_proofs and not game.two_player_zero_sum:
        raise GameError(f"{where}: solver_proofs on a two-seat game whose returns do not cancel "
                        f"(the solver proves a two-seat node as zero-sum)")
    rules = load_rules(game.rules_module, key)
    stated = {"WORDS": game.words, "NUM_ACTIONS": a, "NUM_PLAYERS": n, "MAX_PLIES": game.max_plies}
    for name, value in stated.items():
        if getattr(rules, name) != value:
            raise GameError(f"{where}: {game.rules_module}.{name} is {getattr(rules, name)}, the game says {value}")
    rng = np.random.default_rng(seed)
    for _ in range(playouts):
        _check_playout(game, rules, rng, where)


def _fail(where: str, text: str, what: str) -> GameError:
    return GameError(f"{where}: inconsistent rules after {text!r}: {what}")


def _check_playout(game: Game, rules, rng: np.random.Generator, where: str) -> None:
    n, a = game.num_players, game.num_actions
    state = game.initial_state()
    returns = np.zeros(n)
    moves = np.zeros(a, dtype=np.uint8)
    out = np.zeros(game.words, dtype=np.uint64)
    while True:
        text = state.to_text()
        if state.ply > game.max_plies:
            raise _fail(where, text, f"ply {state.ply} passed max_plies {game.max_plies}")
        words = game.state_words([state])
        if words.shape != (1, game.words) or words.dtype != np.uint64:
            raise _fail(where, text, f"state_words gave {words.dtype} {words.shape}, not uint64 (1, {game.words})")
        finished = bool(rules.terminal(words[0], np.int64(state.ply), returns))
        if finished != state.is_terminal:
            raise _fail(where, text, f"is_terminal {state.is_terminal} but the compiled terminal says {finished}")
        legal = state.legal_moves()
        mask = np.asarray(state.legal_mask(), dtype=bool)
        if mask.shape != (a,) or sorted(np.flatnonzero(mask).tolist()) != sorted(legal):
            raise _fail(where, text, f"legal_mask {np.flatnonzero(mask).tolist()} is not legal_moves {legal}")
        if not np.array_equal(game.words_legal_masks(words)[0], mask):
            raise _fail(where, text, "words_legal_masks differs from legal_mask")
        if state.is_terminal:
            r = np.asarray(state.returns(), dtype=np.float64)
            if r.shape != (n,) or not np.isfinite(r).all():
                raise _fail(where, text, f"returns() gave {r!r}, not {n} finite numbers")
            if not np.allclose(returns, r):
                raise _fail(where, text, f"returns() {r.tolist()} but the compiled terminal gives {returns.tolist()}")
            if legal:
                raise _fail(where, text, f"finished, yet legal moves {legal}")
            return
        try:
            state.returns()
        except GameError:
            pass
        else:
            raise _fail(where, text, "returns() answered before the end (it must raise GameError)")
        if not legal:
            raise _fail(where, text, "not finished, yet no legal move")
        if not 0 <= state.to_move < n or rules.to_move(words[0], np.int64(state.ply)) != state.to_move:
            raise _fail(where, text, f"to_move {state.to_move} is no seat of {n} or differs from the compiled to_move")
        if rules.legal(words[0], np.int64(state.ply), moves) != len(legal) or \
                sorted(np.flatnonzero(moves).tolist()) != sorted(legal):
            raise _fail(where, text, f"the compiled legal gives {np.flatnonzero(moves).tolist()}, not {legal}")
        planes = np.asarray(state.planes())
        if planes.shape != tuple(game.plane_shape) or not np.allclose(game.words_planes(words)[0], planes):
            raise _fail(where, text, f"planes of shape {planes.shape} differ from plane_shape "
                                     f"{tuple(game.plane_shape)} or from words_planes")
        children = []
        for action in legal:
            try:
                children.append(state.play(int(action)))
            except Exception as exc:  # noqa: BLE001 - a legal action must never raise
                raise _fail(where, text, f"legal action {action} raised {type(exc).__name__}: {exc}") from None
        pick = int(rng.integers(len(legal)))
        rules.play(words[0], np.int64(legal[pick]), out)
        if not np.array_equal(out, game.state_words([children[pick]])[0]):
            raise _fail(where, text, f"the compiled play of {legal[pick]} differs from GameState.play")
        state = children[pick]
