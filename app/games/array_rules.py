"""The contract of a game's compiled node rules: what the array search is compiled against.

A game names one module by its import path (`Game.rules_module`); the search
(app/games/search/search_kernel.py) is compiled once per game against it (numba, `cache=True`, the
kernel's source written per game under the kernel cache directory and keyed by a hash of
both sources, so an edit of either compiles afresh), and calls these functions inside its own
compiled loop, one node at a time. The module defines, at top level:

Constants (Python ints):
    WORDS        uint64 words of a position (`Game.words`)
    NUM_ACTIONS  actions (`Game.num_actions`)
    NUM_PLAYERS  seats (`Game.num_players`)
    MAX_PLIES    the most plies a game lasts (`Game.max_plies`); the length discount's scale

Functions, each `@numba.njit(cache=True)`; `words` is a 1-D uint64 array view of length
WORDS (never written by a rule but `play`'s `out`), `ply` an int64 (plies played so far):
    play(words, action, out) -> None
        write the position after `action` (a legal action) into `out` (length WORDS).
    to_move(words, ply) -> int64
        the seat that acts, 0..NUM_PLAYERS-1.
    terminal(words, ply, returns) -> bool
        True when the game is over; then fill `returns` (float64, length NUM_PLAYERS) with
        each seat's raw result, as `GameState.returns()` (the search scales it by the length
        discount itself: r * (1 - d * ply / MAX_PLIES)). False: leave `returns` alone.
    legal(words, ply, moves) -> int64
        for an unfinished position: set moves[a] = 1 for each legal action, 0 otherwise
        (uint8, length NUM_ACTIONS), and return how many are legal (>= 1).

Optional (a two-player zero-sum game's immediate-win / forced-move check; the search calls it
at node creation when `SearchConfig.threat_check` is on and the game, of two seats, has `solver_proofs`):
    threats(words, ply, moves) -> int64, one of
        THREAT_NONE (0)  nothing known: the search takes `legal` (moves left unspecified);
        THREAT_WIN  (1)  the mover wins on the spot: `moves` holds the winning actions (the
                         search proves the node worth a win next ply and searches only them);
        THREAT_LOSS (2)  every legal move lets the opponent win on the spot (the node is proven
                         lost in two plies; the search takes `legal` for its moves);
        THREAT_SAFE (3)  `moves` holds the legal moves after which the opponent cannot win on
                         the spot (>= 1; all of them if none is unsafe): the search spreads
                         over these only, and plays a single one through without evaluating.
    A game with this hook must answer THREAT_WIN for every position with a win on the spot,
    since the solver's proofs lean on it (a win found later is at least three plies away).

Optional, for the compiled random playouts (the rollout evaluator of a game without its own
`Game.playout_values`):
    ply_of(words) -> int64
        the ply of a position from its words alone (an evaluator is handed words, not plies).

`Game.state_words` must give, for each `GameState`, the words these functions read, and
`Game.words_planes` / `words_legal_masks` the batch forms of `planes` / `legal_mask`;
`app.games.checks.check_game` plays random games through both and refuses a game whose two
forms disagree.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import numpy as np
from numba import njit

from app.games.base import GameError

THREAT_NONE, THREAT_WIN, THREAT_LOSS, THREAT_SAFE = 0, 1, 2, 3
REQUIRED_CONSTANTS = ("WORDS", "NUM_ACTIONS", "NUM_PLAYERS", "MAX_PLIES")
REQUIRED_FUNCTIONS = ("play", "to_move", "terminal", "legal")


@njit(cache=True)
def no_threats(words: np.ndarray, ply: np.int64, moves: np.ndarray) -> np.int64:
    """The hook of a game without one: nothing known."""
    return THREAT_NONE


@njit(cache=True)
def no_ply_of(words: np.ndarray) -> np.int64:
    """The stand-in of a game without `ply_of` (its compiled playouts are refused)."""
    return -1


def load_rules(path: str, key: str = "game") -> ModuleType:
    """The rules module at `path`, checked for every required name; a GameError naming the
    config key otherwise."""
    try:
        module = importlib.import_module(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is the user's path
        raise GameError(f"{key}: the rules module {path!r} does not import: {exc}") from exc
    missing = [n for n in REQUIRED_CONSTANTS + REQUIRED_FUNCTIONS if not hasattr(module, n)]
    if missing:
        raise GameError(f"{key}: the rules module {path!r} lacks {', '.join(missing)} (app/games/array_rules.py)")
    for n in REQUIRED_FUNCTIONS + tuple(o for o in ("threats", "ply_of") if hasattr(module, o)):
        if not hasattr(getattr(module, n), "py_func"):
            raise GameError(f"{key}: {path}.{n} is not compiled with numba.njit")
    return module


def generated_dir() -> Path:
    """Where generated modules live (a game's rules at another size, the search kernels):
    `SELFPLAY_KERNEL_DIR`, else `$XDG_CACHE_HOME/selfplay-mesh/kernels` (~/.cache by default);
    on sys.path once asked for, so a generated rules module imports by its name anywhere."""
    explicit = os.environ.get("SELFPLAY_KERNEL_DIR")
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    directory = Path(explicit) if explicit else Path(cache) / "selfplay-mesh" / "kernels"
    directory.mkdir(parents=True, exist_ok=True)
    if str(directory) not in sys.path:
        sys.path.append(str(directory))
    return directory


def write_module(name: str, source: str) -> Path:
    """`source` as `<generated_dir>/<name>.py`, written only when it differs (a temp name,
    fsync, rename: concurrent processes never see half a file)."""
    directory = generated_dir()
    target = directory / f"{name}.py"
    if not target.exists() or target.read_text() != source:
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(source)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    return target


def source_digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]
