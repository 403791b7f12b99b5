"""The equivalence check of the array search against the per-tree search it replaced: a fixed
evaluator (a seeded table of priors and values, a hash of the position), 500 positions,
four search settings, and how each setting's positions are searched (one batch, then a
second search after the move, on the reused tree).

tests/fixtures/search_equivalence.json holds what the per-tree search of e1e3464 answered
(written by tests/legacy/make_fixture.py, which ran the frozen copy tests/legacy/legacy_search.py;
both were removed with the per-tree search: `git show 5a8fbea:tests/legacy/make_fixture.py`);
tests/test_search_equivalence.py asks the array search the same and compares.
"""

from __future__ import annotations

import random

import numpy as np

from app.config import SearchConfig
from app.games import get_game

GAME = get_game("connect4")
POSITIONS = 500
FIXTURE_SEED = 47
# (name, SearchConfig fields, simulations, noise, leaves per round, simulations after the move)
SETTINGS = (
    ("default-noise", {}, 64, True, 1, 32),
    ("default-virtual-loss", {}, 96, False, 8, 24),
    ("forced-playouts", {"forced_playouts": 2.0}, 128, True, 1, 32),
    ("plain", {"threat_check": False, "length_discount": 0.0}, 64, False, 1, 32),
)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class TableEvaluator:
    """Priors and value a fixed function of the position (a seeded hash of its words), float32
    like a network's: the same position always gets the same answer, whatever the batch."""

    def __init__(self, seed: int = 0) -> None:
        self.game = GAME
        self.seed = np.uint64(seed)
        self.positions = 0
        self.batches = 0

    def evaluate_batch(self, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        self.positions += len(words)
        self.batches += 1
        with np.errstate(over="ignore"):
            h = _mix(words[:, 0] ^ _mix(words[:, 1] ^ self.seed))
        raw = np.stack([((h >> np.uint64(8 * a)) & np.uint64(0xFF)).astype(np.float32) + 1.0 for a in range(7)], axis=1)
        raw *= GAME.words_legal_masks(words)
        priors = raw / np.maximum(raw.sum(axis=1, keepdims=True), np.float32(1.0))
        values = ((h >> np.uint64(56)).astype(np.float32) / np.float32(255.0)) * np.float32(1.8) - np.float32(0.9)
        return priors.astype(np.float32), values.astype(np.float32)

    def evaluate(self, states) -> tuple[np.ndarray, np.ndarray]:
        return self.evaluate_batch(GAME.state_words(states))


def positions(count: int = POSITIONS, seed: int = FIXTURE_SEED) -> list[str]:
    """Distinct unfinished positions, 0 to 34 random plies deep (move strings)."""
    rng = random.Random(seed)
    out: list[str] = []
    seen = set()
    while len(out) < count:
        state = GAME.initial_state()
        for _ in range(rng.randrange(0, 35)):
            nxt = state.play(rng.choice(state.legal_moves()))
            if nxt.is_terminal:
                break
            state = nxt
        if state.to_text() not in seen:
            seen.add(state.to_text())
            out.append(state.to_text())
    return out


def setting_of(index: int) -> tuple:
    return SETTINGS[index % len(SETTINGS)]


def config_of(setting: tuple) -> SearchConfig:
    return SearchConfig(**setting[1])
