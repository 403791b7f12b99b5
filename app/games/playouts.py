"""Random playouts of any game with compiled node rules (app/games/array_rules.py): the values
pure Monte Carlo tree search backs up, for games without a hand-written playout
(`connect4_playouts` is Connect Four's own).

`playout_values(game, words, plies, n, rng)` plays `n` uniformly random games to the end from
each position and averages each seat's raw return, giving them in the network's value
convention (`Game.value_size`): the mover's mean return (B,) for a two-player zero-sum game,
else (B, N) with entry k for seat (to_move + k) % N. The loop is compiled once per rules
module (a numba closure over its functions, not cached on disk: ~2-5 s the first call).
`plies` reach the rules' `to_move` and `terminal`; an evaluator that has only a batch's words
passes what it knows (Othello's and the three-player game's rules read the words alone).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
from numba import njit

from app.games.array_rules import load_rules
from app.games.base import Game


@lru_cache(maxsize=None)
def _compiled(rules_path: str):
    rules = load_rules(rules_path)
    play, legal, terminal, to_move = rules.play, rules.legal, rules.terminal, rules.to_move
    words_n, actions, players = rules.WORDS, rules.NUM_ACTIONS, rules.NUM_PLAYERS

    @njit
    def run(words, plies, n, seed, out):
        np.random.seed(seed)
        cur = np.empty(words_n, dtype=np.uint64)
        nxt = np.empty(words_n, dtype=np.uint64)
        moves = np.empty(actions, dtype=np.uint8)
        result = np.zeros(players)
        for i in range(len(words)):
            mover = to_move(words[i], plies[i])
            for _ in range(n):
                cur[:] = words[i]
                ply = plies[i]
                while not terminal(cur, ply, result):
                    count = legal(cur, ply, moves)
                    pick = np.random.randint(count)
                    for a in range(actions):
                        if moves[a]:
                            if pick == 0:
                                play(cur, a, nxt)
                                break
                            pick -= 1
                    cur[:] = nxt
                    ply += 1
                for k in range(players):  # entry k: the seat k after the mover
                    out[i, k] += result[(mover + k) % players] / n
        return out

    return run


def playout_values(game: Game, words: np.ndarray, plies: np.ndarray, n: int,
                   rng: np.random.Generator) -> np.ndarray:
    """Mean raw returns of `n` random games from each position, in the value convention above."""
    words = np.ascontiguousarray(words, dtype=np.uint64)
    out = np.zeros((len(words), game.num_players))
    _compiled(game.rules_module)(words, np.asarray(plies, dtype=np.int64), int(n), int(rng.integers(2**31)), out)
    return out[:, 0] if game.value_size == 1 else out
