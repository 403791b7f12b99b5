"""Random playouts over any game's compiled rules: the rollout evaluator's leaf values for a
game without playouts of its own (`Game.playout_values`).

A template like search_kernel.py (apart from it because it is not the search: it evaluates
leaves, and a change here need not recompile the search): `app/games/search/kernel_build.py`
writes a copy per game with the RULES line bound to `Game.rules_module` and numba caches it.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from app.games.array_rules import no_ply_of

rules = None  # RULES: kernel_build writes `import <the game's rules module> as rules` here

A = rules.NUM_ACTIONS
NP = rules.NUM_PLAYERS
WORDS = rules.WORDS
ply_of = getattr(rules, "ply_of", no_ply_of)
HAS_PLY_OF = hasattr(rules, "ply_of")


@njit(cache=True)
def playout_values(words, rollouts, seed, value_size, out):
    """Mean raw result of `rollouts` uniformly random games from each position of `words`
    (B, WORDS), into `out` (B, value_size): the mover's (value_size 1) or every seat's from
    the mover on. numba's own generator, seeded with `seed`."""
    np.random.seed(seed)
    w = np.empty(WORDS, dtype=np.uint64)
    nxt = np.empty(WORDS, dtype=np.uint64)
    row = np.empty(A, dtype=np.uint8)
    ret = np.zeros(NP)
    acc = np.zeros(NP)
    for b in range(words.shape[0]):
        start = ply_of(words[b])
        mover = rules.to_move(words[b], start)
        for i in range(NP):
            acc[i] = 0.0
        for _ in range(rollouts):
            for i in range(WORDS):
                w[i] = words[b, i]
            ply = start
            while not rules.terminal(w, ply, ret):
                pick = np.random.randint(rules.legal(w, ply, row))
                a = 0
                for a in range(A):
                    if row[a]:
                        if pick == 0:
                            break
                        pick -= 1
                rules.play(w, a, nxt)
                for i in range(WORDS):
                    w[i] = nxt[i]
                ply += 1
            for i in range(NP):
                acc[i] += ret[i]
        for k in range(value_size):
            out[b, k] = acc[(mover + k) % NP] / rollouts
