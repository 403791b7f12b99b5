"""The batched PUCT search: every tree of a self-play batch or a gauntlet wave in one set of
arrays (`SearchForest`), advanced in lock step against one evaluator.

    forest = SearchForest.for_search(game, cfg)     # cfg: a SearchConfig
    slot = forest.add(state)                          # one tree a game; `release` frees it
    [result] = forest.search([slot], evaluator, simulations, cfg, rng, add_noise=False)
    forest.advance(slot, action)                      # reuse: the chosen subtree's visits stay

Each round every searched tree selects a leaf (several with virtual loss when
`leaves_per_round` > 1, for one big search), exact leaves (finished games, proven positions)
are backed up on the spot, and all other leaves go to the evaluator in ONE
`evaluate_batch(words)` call: their positions as the game's batch form (uint64 words), so
the network's input and legal masks are array operations. Selection, node creation with the
game's threat hook, backup and proofs run compiled over all trees (app/games/search/search_kernel.py,
whose docstring says the rules, compiled once per game by app/games/search/kernel_build.py); Python
does one loop iteration per round, not per tree. Any game with an array form is searched:
values are backed up as one entry per seat, each node choosing by its mover's (max^n).

`simulations` new simulations are run per call (reused visits come on top). Dirichlet noise
(cfg.dirichlet_alpha, cfg.dirichlet_fraction) is mixed into the root prior only, and only
when `add_noise` is set (self-play), never stored into the tree; with it, cfg.forced_playouts
> 0 forces visits to every root move the noise favours and `visits` (the policy target) is
the counts with those visits pruned out again (`pruned_counts`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from app.games.search.kernel_build import kernel_for
from app.games.search.kernel_warm import ensure_compiled
from app.games.search.search_result import SearchResult
from app.games import Game, GameState

if TYPE_CHECKING:
    from app.games.search.evaluators import Evaluator
    from app.config.pipeline import SearchConfig

class SearchForest:
    """Trees in slots of shared arrays; a slot holds one game's tree from `add` to `release`.

    `length_discount` and `threat_check` shape the nodes a tree creates (SearchConfig's);
    `capacity` is the first number of node slots a tree gets, doubled for all trees whenever
    one would run out (`advance` packs the kept subtree, so a tree holds about one search)."""

    def __init__(self, game: Game, length_discount: float = 0.0, threat_check: bool = False,
                 trees: int = 1, capacity: int = 256) -> None:
        self.game = game
        self.K = kernel_for(game)
        ensure_compiled(self.K.__file__, lambda: tiny_search(game))  # one process compiles, the rest wait
        self.proofs = bool(game.solver_proofs)
        self.value_size = int(game.value_size)
        self.length_discount = float(length_discount)
        self.threat_check = bool(threat_check)
        self.capacity = max(int(capacity), 2 * self.K.MAX_NEW_NODES)
        self._states: list[GameState | None] = []
        self._free: list[int] = []
        self._allocate(max(1, trees), self.capacity)

    @classmethod
    def for_search(cls, game: Game, cfg: "SearchConfig", trees: int = 1, capacity: int = 256) -> "SearchForest":
        """A forest with the search settings `cfg` gives the trees a say in."""
        return cls(game, cfg.length_discount, cfg.threat_check, trees, capacity)

    # -- slots ----------------------------------------------------------------------------------

    def add(self, state: GameState) -> int:
        """A new tree rooted at `state`; returns its slot."""
        if self._free:
            slot = self._free.pop()
        else:
            slot = len(self._states)
            self._states.append(None)
            if slot >= self.trees_i.shape[0]:
                self._resize(2 * self.trees_i.shape[0], self.capacity)
        self.reset(slot, state)
        return slot

    def reset(self, slot: int, state: GameState) -> None:
        """Root the tree in `slot` at `state` afresh (a new game in the same slot)."""
        self._states[slot] = state
        self.K.new_roots(np.array([slot], dtype=np.int64), self.game.state_words([state]),
                         np.array([state.ply], dtype=np.int64), self.length_discount, self.threat_check,
                         self.proofs, *self._node_arrays(), self.trees_f)

    def release(self, slot: int) -> None:
        """Free a slot for a later `add` (its tree is dropped)."""
        if self._states[slot] is None:
            raise ValueError(f"slot {slot} is not in use")
        self._states[slot] = None
        self._free.append(slot)

    def slots(self) -> list[int]:
        return [i for i, s in enumerate(self._states) if s is not None]

    def root_state(self, slot: int) -> GameState:
        state = self._states[slot]
        if state is None:
            raise ValueError(f"slot {slot} is not in use")
        return state

    def node_count(self, slot: int) -> int:
        return int(self.trees_i[slot, self.K.COUNT])

    def advance(self, slot: int, action: int) -> None:
        """Move the root to the child after `action`, keeping its subtree's statistics; an
        illegal move raises the game's IllegalMoveError and changes nothing."""
        state = self.root_state(slot).play(int(action))
        if self.trees_i[slot, self.K.COUNT] + 1 > self.capacity:
            self._resize(self.trees_i.shape[0], 2 * self.capacity)
        self.K.advance(slot, int(action), self.length_discount, self.threat_check, self.proofs, self._keep,
                       *self._node_arrays(), self.trees_f)
        self._states[slot] = state

    # -- the search -----------------------------------------------------------------------------

    def search(self, slots: Sequence[int], evaluator: "Evaluator", simulations: int | Sequence[int],
               cfg: "SearchConfig", rng: np.random.Generator, add_noise: bool | Sequence[bool] = False,
               leaves_per_round: int = 1) -> list[SearchResult]:
        """Run `simulations` new simulations in the tree of every slot, batching leaf
        evaluations across them; `simulations` and `add_noise` may be given per slot
        (playout-cap randomisation mixes full, noisy searches with fast, noise-free ones).
        Raises ValueError for a finished root. Roots never expanded are evaluated first, in
        one batch, and that does not count as a simulation."""
        slots = [int(s) for s in slots]
        budgets = ([int(simulations)] * len(slots) if isinstance(simulations, (int, np.integer))
                   else [int(s) for s in simulations])
        noisy = [bool(add_noise)] * len(slots) if isinstance(add_noise, (bool, np.bool_)) else [bool(n) for n in add_noise]
        if len(budgets) != len(slots) or len(noisy) != len(slots):
            raise ValueError(f"{len(budgets)} budgets and {len(noisy)} noise flags for {len(slots)} trees")
        if len(set(slots)) != len(slots):
            raise ValueError("each slot may be searched once a call")
        if any(b < 0 for b in budgets):
            raise ValueError(f"simulations must be >= 0, got {min(budgets)}")
        if leaves_per_round < 1:
            raise ValueError(f"leaves_per_round must be >= 1, got {leaves_per_round}")
        for slot in slots:
            if self.root_state(slot).is_terminal:
                raise ValueError(f"cannot search a finished game: {self.root_state(slot).to_text()!r}")
        ids = np.array(slots, dtype=np.int64)
        self._expand_roots(ids, evaluator)
        for slot, noise in zip(slots, noisy):
            if noise:
                legal = self.root_state(slot).legal_moves()
                self.K.set_root_noise(slot, rng.dirichlet([cfg.dirichlet_alpha] * len(legal)),
                                      cfg.dirichlet_fraction, cfg.forced_playouts, self.edges, self.moves,
                                      self.trees_i, self.trees_f)
        self._simulate(ids, np.array(budgets, dtype=np.int64), evaluator, cfg.c_puct, leaves_per_round)
        return self._results(ids, cfg.c_puct)

    def _values(self, values: np.ndarray, n: int) -> np.ndarray:
        """The evaluator's values as (n, value_size) float64, each row its leaf's mover's view."""
        out = np.asarray(values, dtype=np.float64).reshape(n, -1)
        if out.shape[1] != self.value_size:
            raise ValueError(f"the evaluator gave {out.shape[1]} values a position, {self.game.name} has "
                             f"value_size {self.value_size}")
        return out

    def _expand_roots(self, ids: np.ndarray, evaluator: "Evaluator") -> None:
        roots = self.trees_i[ids, self.K.ROOT]
        fresh = self.nodes_i[ids, roots, self.K.STATE] == self.K.NEW
        if not fresh.any():
            return
        ids, roots = ids[fresh], roots[fresh]
        priors, values = evaluator.evaluate_batch(self.words[ids, roots])
        self.K.expand_nodes(ids, roots.astype(np.int64), np.asarray(priors, dtype=np.float64),
                            self._values(values, len(ids)), self.moves, self.nodes_f, self.nodes_i, self.edges)

    def _simulate(self, ids: np.ndarray, budgets: np.ndarray, evaluator: "Evaluator", c_puct: float,
                  per_round: int) -> None:
        remaining = np.zeros(self.trees_i.shape[0], dtype=np.int64)
        remaining[ids] = budgets
        selected = np.zeros_like(remaining)
        virtual = per_round > 1
        rows = len(ids) * per_round
        K = self.K
        pending = np.zeros((rows, K.PEND_PATH + K.MAX_PATH), dtype=np.int64)
        slot_of = np.zeros(rows, dtype=np.int64)
        unique = np.zeros((rows, 2), dtype=np.int64)
        active = ids[budgets > 0]
        while active.size:
            selected[active] = 0
            n_pending = n_unique = start = 0
            while True:
                n_pending, n_unique, start = K.select_round(
                    active, start, remaining, selected, per_round, virtual, c_puct, self.length_discount,
                    self.threat_check, self.proofs, pending, n_pending, slot_of, unique, n_unique, self.capacity,
                    *self._node_arrays(), self.trees_f)
                if start < 0:
                    break
                self._resize(self.trees_i.shape[0], 2 * self.capacity)
            if n_unique:
                leaves = unique[:n_unique]
                priors, values = evaluator.evaluate_batch(self.words[leaves[:, 0], leaves[:, 1]])
                K.expand_and_backup(pending, n_pending, slot_of, unique, np.asarray(priors, dtype=np.float64),
                                    self._values(values, n_unique), virtual, self.edges, self.moves,
                                    self.nodes_f, self.nodes_i)
            active = active[remaining[active] > 0]

    def _results(self, ids: np.ndarray, c_puct: float) -> list[SearchResult]:
        n, A = len(ids), self.game.num_actions
        counts, q, prior, child_proven = (np.zeros((n, A)) for _ in range(4))
        root_value, proven = np.zeros(n), np.zeros(n)
        self.K.root_summary(ids, counts, q, prior, root_value, proven, child_proven, self.edges, self.child,
                            self.nodes_f, self.nodes_i, self.trees_i)
        out = []
        for j, slot in enumerate(ids):
            target = self._pruned(int(slot), counts[j], q[j], c_puct)
            total = target.sum()
            out.append(SearchResult(
                visits=target / total if total > 0 else prior[j].copy(),  # no simulation: the prior
                counts=counts[j], q=q[j], prior=prior[j], root_value=float(root_value[j]),
                proven=None if math.isnan(proven[j]) else float(proven[j]), child_proven=child_proven[j]))
        return out

    # -- the root, read back ----------------------------------------------------------------------

    def root_counts(self, slot: int) -> np.ndarray:
        return self.edges[slot, self.trees_i[slot, self.K.ROOT], self.K.N_].copy()

    def root_prior(self, slot: int) -> np.ndarray:
        """The evaluator's prior at the root (without noise)."""
        return self.edges[slot, self.trees_i[slot, self.K.ROOT], self.K.P_].copy()

    def noisy_root_prior(self, slot: int) -> np.ndarray | None:
        """The root prior with the noise of the last noisy search mixed in (None without)."""
        return self.trees_f[slot, :self.K.A].copy() if self.trees_f[slot, self.K.NOISY] else None

    def pruned_counts(self, slot: int, c_puct: float) -> np.ndarray:
        """`SearchResult.visits` before normalising: the root counts less forced playouts."""
        root = self.trees_i[slot, self.K.ROOT]
        counts = self.root_counts(slot)
        w = self.edges[slot, root, self.K.W_]
        q = np.divide(w, counts, out=np.zeros_like(w), where=counts > 0)
        return self._pruned(slot, counts, q, c_puct)

    def _pruned(self, slot: int, counts: np.ndarray, q: np.ndarray, c_puct: float) -> np.ndarray:
        """KataGo's policy target pruning: each move but the most visited one loses up to
        sqrt(k * p * N) visits, as many as it can while its PUCT score stays at or below the
        most visited move's, and a move left with one visit or fewer is dropped. What remains
        is what PUCT alone would have spent, so forcing widens what the search looks at without
        teaching the network that those moves were good. Without forced playouts: the counts."""
        K = self.K
        k = float(self.trees_f[slot, K.FORCED_K])
        total = float(counts.sum())
        if k <= 0.0 or not self.trees_f[slot, K.NOISY] or total <= 0.0:
            return counts
        prior = self.trees_f[slot, :K.A].tolist()
        scale = c_puct * math.sqrt(total + 1.0)
        best = int(np.argmax(counts))
        best_score = q[best] + scale * prior[best] / (1.0 + counts[best])
        out = counts.copy()
        searched = self.moves[slot, self.trees_i[slot, K.ROOT]]
        for a in range(K.A):
            n = counts[a]
            if not searched[a] or a == best or n <= 0.0:
                continue
            floor = max(0.0, n - math.sqrt(k * prior[a] * total))
            gap = best_score - q[a]
            # fewest visits at which the move's score still does not pass the best one's
            needed = math.ceil(scale * prior[a] / gap - 1.0) if gap > 0.0 else n
            kept = min(n, max(floor, float(needed)))
            out[a] = kept if kept > 1.0 else 0.0
        return out

    # -- storage --------------------------------------------------------------------------------

    def _node_arrays(self) -> tuple:
        return self.edges, self.child, self.words, self.moves, self.nodes_f, self.nodes_i, self.trees_i

    def _allocate(self, trees: int, capacity: int) -> None:
        A = self.game.num_actions
        self.edges = np.zeros((trees, capacity, 3, A))
        self.child = np.full((trees, capacity, A), -1, dtype=np.int32)
        self.words = np.zeros((trees, capacity, self.K.WORDS), dtype=np.uint64)
        self.moves = np.zeros((trees, capacity, A), dtype=np.uint8)
        self.nodes_f = np.zeros((trees, capacity, 1 + self.K.NP))
        self.nodes_i = np.zeros((trees, capacity, 4), dtype=np.int32)
        self.trees_i = np.zeros((trees, 2), dtype=np.int32)
        self.trees_f = np.zeros((trees, A + 2))
        self._keep = np.zeros(capacity, dtype=np.int32)
        self.capacity = capacity

    def _resize(self, trees: int, capacity: int) -> None:
        old = (self.edges, self.child, self.words, self.nodes_f, self.nodes_i, self.trees_i, self.trees_f, self.moves)
        t, c = self.trees_i.shape[0], self.capacity
        self._allocate(trees, capacity)
        self.edges[:t, :c] = old[0]
        self.child[:t, :c] = old[1]
        self.words[:t, :c] = old[2]
        self.nodes_f[:t, :c] = old[3]
        self.nodes_i[:t, :c] = old[4]
        self.trees_i[:t] = old[5]
        self.trees_f[:t] = old[6]
        self.moves[:t, :c] = old[7]


def tiny_search(game: Game) -> None:
    """A few simulations on two trees, noise on, with and without the threat hook: what
    self-play and the gauntlet call first (kernel_warm.py compiles a kernel with it)."""
    from app.config.pipeline import SearchConfig
    from app.games.search.evaluators import UniformEvaluator

    cfg = SearchConfig()
    for threat_check in (False, True):
        forest = SearchForest(game, cfg.length_discount, threat_check, trees=2)
        slots = [forest.add(game.initial_state()) for _ in range(2)]
        forest.search(slots, UniformEvaluator(game), 8, cfg, np.random.default_rng(0), add_noise=True)
        forest.advance(slots[0], int(np.argmax(forest.root_counts(slots[0]))))
