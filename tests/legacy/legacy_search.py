"""FROZEN copy of the per-tree search as it was at e1e3464 (app/ai/search_tree.py and
`run_searches` of app/ai/mcts.py), kept only while the array search is measured and checked
side by side with it (scripts/bench_selfplay.py --legacy, tests/legacy/make_fixture.py).
Not used by the application. Removed once the fixture of its visit counts is committed."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Sequence

import numpy as np

from app.ai.mcts import SearchResult
from app.games import GameState, result_scale

if TYPE_CHECKING:
    from app.config.pipeline import SearchConfig

FPU_VALUE = 0.0  # value assumed for an unvisited edge ("first play urgency")
FORCED_BONUS = 1e9  # added to a forced root move's PUCT score: above any unforced one


class SearchTree:
    """A search tree rooted at `state`; `advance(action)` keeps the chosen subtree."""

    __slots__ = (
        "num_actions", "_states", "_child", "_n", "_w", "_p", "_legal", "_proven",
        "_value", "_root", "_root_prior", "length_discount", "threat_check", "_moves", "_root_forced_k",
    )

    def __init__(self, state: GameState, num_actions: int | None = None, length_discount: float = 0.0,
                 threat_check: bool = False) -> None:
        self.num_actions = int(num_actions if num_actions is not None else len(state.legal_mask()))
        self.length_discount = float(length_discount)  # SearchConfig.length_discount
        self.threat_check = bool(threat_check)  # SearchConfig.threat_check
        self._states: list[GameState] = []
        self._child: list[int] = []
        self._n: list[float] = []
        self._w: list[float] = []
        self._p: list[float] = []
        self._legal: list[list[int] | None] = []  # None until the node is expanded
        self._moves: list[list[int] | None] = []  # with threat_check: the moves to search, found at creation
        self._proven: list[float | None] = []  # exact value, side to move's view
        self._value: list[float] = []  # evaluator's value at expansion
        self._root_prior: list[float] | None = None  # root priors with noise mixed in
        self._root_forced_k = 0.0  # forced playouts at the root (set_root_noise); 0 = off
        self._root = self._new_node(state)

    @classmethod
    def for_search(cls, state: GameState, cfg: "SearchConfig", num_actions: int | None = None) -> "SearchTree":
        """A tree with the search settings `cfg` (a SearchConfig) gives it a say in."""
        return cls(state, num_actions, cfg.length_discount, cfg.threat_check)

    # -- public view ---------------------------------------------------------------------

    @property
    def root_state(self) -> GameState:
        return self._states[self._root]

    @property
    def node_count(self) -> int:
        return len(self._states)

    def root_expanded(self) -> bool:
        return self._legal[self._root] is not None

    def root_proven(self) -> float | None:
        return self._proven[self._root]

    def root_child_proven(self) -> np.ndarray:
        """Exact value of each root move from the root's side to move where its child is
        proven, NaN elsewhere (unvisited, unproven, or not searched)."""
        out = np.full(self.num_actions, np.nan)
        base = self._root * self.num_actions
        for a in range(self.num_actions):
            child = self._child[base + a]
            if child >= 0 and self._proven[child] is not None:
                out[a] = -self._proven[child]
        return out

    def root_counts(self) -> np.ndarray:
        """Visit count of each root edge, float64 (A,)."""
        base = self._root * self.num_actions
        return np.array(self._n[base: base + self.num_actions], dtype=np.float64)

    def pruned_counts(self, c_puct: float) -> np.ndarray:
        """Root visit counts with the forced playouts taken back out (KataGo's policy target
        pruning): each move but the most visited one loses up to sqrt(k * p * N) visits, as many
        as it can while its PUCT score stays at or below the most visited move's, and a move
        left with one visit or fewer is dropped. Without forced playouts: `root_counts()`.
        What remains is what PUCT alone would have spent, so forcing widens what the search
        looks at without teaching the network that those moves were good."""
        counts = self.root_counts()
        k = self._root_forced_k
        total = float(counts.sum())
        if k <= 0.0 or self._root_prior is None or total <= 0.0:
            return counts
        q = self.root_q()
        prior = self._root_prior
        scale = c_puct * math.sqrt(total + 1.0)
        best = int(np.argmax(counts))
        best_score = q[best] + scale * prior[best] / (1.0 + counts[best])
        out = counts.copy()
        for a in self._legal[self._root] or []:
            n = counts[a]
            if a == best or n <= 0.0:
                continue
            floor = max(0.0, n - math.sqrt(k * prior[a] * total))
            gap = best_score - q[a]
            # fewest visits at which the move's score still does not pass the best one's
            needed = math.ceil(scale * prior[a] / gap - 1.0) if gap > 0.0 else n
            kept = min(n, max(floor, float(needed)))
            out[a] = kept if kept > 1.0 else 0.0
        return out

    def root_q(self) -> np.ndarray:
        """Mean value of each root edge from the root's side to move (0 where unvisited)."""
        base = self._root * self.num_actions
        n = np.array(self._n[base: base + self.num_actions])
        w = np.array(self._w[base: base + self.num_actions])
        return np.divide(w, n, out=np.zeros_like(w), where=n > 0)

    def root_prior(self) -> np.ndarray:
        """The evaluator's prior at the root (without noise), float64 (A,)."""
        base = self._root * self.num_actions
        return np.array(self._p[base: base + self.num_actions], dtype=np.float64)

    def root_value(self) -> float:
        """Search value of the root, side to move's view: exact if proven, else W/N."""
        proven = self._proven[self._root]
        if proven is not None:
            return proven
        base = self._root * self.num_actions
        n = sum(self._n[base: base + self.num_actions])
        if n == 0:
            return self._value[self._root]
        return sum(self._w[base: base + self.num_actions]) / n

    def advance(self, action: int) -> None:
        """Move the root to the child after `action`, keeping its subtree's statistics."""
        action = int(action)
        edge = self._root * self.num_actions + action
        child = self._child[edge]
        if child < 0:
            child = self._new_node(self._states[self._root].play(action))
            self._child[edge] = child
        self._root = child
        self._root_prior = None
        self._root_forced_k = 0.0

    def set_root_noise(self, noise: np.ndarray, fraction: float, forced_k: float = 0.0) -> None:
        """Mix `noise` (over the root's legal moves, in their order) into the root prior.

        Kept beside the stored prior, not written into it, so reuse never compounds noise.
        `forced_k` > 0 turns on KataGo's forced playouts for this search (SearchConfig.forced_playouts):
        a root move with noisy prior p is chosen whenever it has fewer than sqrt(k * p * N) of the
        root's N visits, so every move the noise favours gets looked at; `pruned_counts` takes
        those visits back out of the policy target.
        """
        self._root_forced_k = float(forced_k)
        legal = self._legal[self._root]
        if legal is None:
            raise RuntimeError("root must be expanded before noise is added")
        base = self._root * self.num_actions
        prior = self._p[base: base + self.num_actions]
        for i, a in enumerate(legal):
            prior[a] = (1.0 - fraction) * prior[a] + fraction * float(noise[i])
        self._root_prior = prior

    # -- one simulation: select, (evaluate elsewhere), expand, backup --------------------------

    def select(self, c_puct: float) -> tuple[list[int], int]:
        """Descend by PUCT to a leaf; returns (edges on the path, leaf node).

        A leaf is an unexpanded node or a proven one (terminal states are proven on
        creation); `leaf_exact(leaf)` tells which. The root is descended even when proven,
        so a solved root still spreads visits over its moves.
        """
        A = self.num_actions
        n_, w_, p_, child_, legal_ = self._n, self._w, self._p, self._child, self._legal
        node = self._root
        path: list[int] = []
        while True:
            if node != self._root and self._proven[node] is not None:
                return path, node
            legal = legal_[node]
            if legal is None:
                moves = self._moves[node]
                if moves is None or len(moves) != 1:
                    return path, node
                legal = self._play_through(node, moves[0])
            base = node * A
            total = 0.0
            for a in legal:
                total += n_[base + a]
            k = c_puct * math.sqrt(total + 1.0)
            prior = self._root_prior if node == self._root and self._root_prior is not None else None
            forced = self._root_forced_k * total if prior is not None else 0.0
            best = -math.inf
            best_a = legal[0]
            for a in legal:
                i = base + a
                n = n_[i]
                p = prior[a] if prior is not None else p_[i]
                score = (w_[i] / n if n else FPU_VALUE) + k * p / (1.0 + n)
                if forced and n * n < forced * p:  # fewer than sqrt(k * p * N) visits: forced
                    score += FORCED_BONUS
                if score > best:
                    best = score
                    best_a = a
            edge = base + best_a
            path.append(edge)
            nxt = child_[edge]
            if nxt < 0:
                nxt = self._new_node(self._states[node].play(best_a))
                child_[edge] = nxt
            node = nxt

    def leaf_exact(self, leaf: int) -> float | None:
        """The exact value of a leaf (side to move's view), or None when it needs evaluation."""
        return self._proven[leaf]

    def leaf_state(self, leaf: int) -> GameState:
        return self._states[leaf]

    def is_expanded(self, node: int) -> bool:
        return self._legal[node] is not None

    def expand(self, node: int, priors: np.ndarray, value: float) -> None:
        """Store the evaluator's priors (A,) and value for `node`; priors renormalised over legal moves."""
        state = self._states[node]
        legal = self._moves[node] or state.legal_moves()
        base = node * self.num_actions
        row = priors.tolist()
        total = sum(row[a] for a in legal)
        if total > 0:
            for a in legal:
                self._p[base + a] = row[a] / total
        else:  # a network that puts (numerically) nothing on any legal move: fall back to uniform
            for a in legal:
                self._p[base + a] = 1.0 / len(legal)
        self._legal[node] = legal
        self._value[node] = float(value)

    def expand_root(self, priors: np.ndarray, value: float) -> None:
        self.expand(self._root, priors, value)

    def _play_through(self, node: int, move: int) -> list[int]:
        """Expand a node whose one safe move is forced without asking the evaluator: its value
        is its only child's, so the simulation goes on to that child. Forced lines (a block,
        then the next block) then cost no network call and the search reads deeper along them."""
        self._p[node * self.num_actions + move] = 1.0
        legal = [move]
        self._legal[node] = legal
        return legal

    def add_virtual_loss(self, path: Sequence[int]) -> None:
        """Count a pending visit as a loss for every mover on the path, steering later
        selections in the same round elsewhere; `backup(..., virtual=True)` undoes it."""
        n_, w_ = self._n, self._w
        for i in path:
            n_[i] += 1.0
            w_[i] -= 1.0

    def backup(self, path: Sequence[int], value: float, virtual: bool = False) -> None:
        """Add one visit with the leaf's `value` (leaf's side to move) along `path`."""
        n_, w_ = self._n, self._w
        v = value
        if virtual:
            for i in reversed(path):
                v = -v
                w_[i] += v + 1.0  # the visit was counted by add_virtual_loss; swap its -1 for v
        else:
            for i in reversed(path):
                v = -v
                n_[i] += 1.0
                w_[i] += v

    def propagate_proof(self, path: Sequence[int]) -> None:
        """After an exact leaf at the end of `path`, mark ancestors that are now solved."""
        A = self.num_actions
        for i in reversed(path):
            node = i // A
            if self._proven[node] is not None:
                return
            legal = self._legal[node]
            base = node * A
            best = -math.inf
            solved = True
            for a in legal:  # type: ignore[union-attr]
                c = self._child[base + a]
                pv = self._proven[c] if c >= 0 else None
                if pv is None:
                    solved = False
                    continue
                if -pv > best:
                    best = -pv
            if (solved and best > -math.inf) or (best > 0.0 and best >= self._quickest_win(node)):
                self._proven[node] = best
            else:
                return

    def _quickest_win(self, node: int) -> float:
        """The most a win can be worth to the side to move at `node`: a win on the next move,
        or with `threat_check` (which proved every node that has one) two moves ahead."""
        state = self._states[node]
        plies = 3 if self.threat_check else 1
        return result_scale(state.ply + plies, state.max_plies, self.length_discount)

    def _threat_check(self, state: GameState) -> tuple[float | None, list[int] | None]:
        """A new node's exact value one ply deep by the rules (or None) and the moves its
        search spreads over: the winning ones if any, else the safe ones, else every move
        (None: all alike lose, so the legal moves are searched)."""
        wins, safe = state.threat_outlook()
        if wins:
            return result_scale(state.ply + 1, state.max_plies, self.length_discount), wins
        if not safe:
            return -result_scale(state.ply + 2, state.max_plies, self.length_discount), None
        return None, safe

    # -- storage -------------------------------------------------------------------------------

    def _new_node(self, state: GameState) -> int:
        node = len(self._states)
        A = self.num_actions
        self._states.append(state)
        self._child.extend([-1] * A)
        self._n.extend([0.0] * A)
        self._w.extend([0.0] * A)
        self._p.extend([0.0] * A)
        if state.is_terminal:
            self._legal.append([])
            self._moves.append(None)
            value = state.terminal_value(self.length_discount)
            self._proven.append(value)
            self._value.append(value)
        else:
            self._legal.append(None)
            proven, moves = self._threat_check(state) if self.threat_check else (None, None)
            self._moves.append(moves)
            self._proven.append(proven)
            self._value.append(0.0 if proven is None else proven)
        return node


def run_searches(
    trees: Sequence[SearchTree],
    evaluator,
    simulations: int | Sequence[int],
    cfg,
    rng: np.random.Generator,
    add_noise: bool | Sequence[bool] = False,
    leaves_per_round: int = 1,
) -> list[SearchResult]:
    """Run `simulations` new simulations in every tree, batching leaf evaluations across trees.

    `simulations` and `add_noise` may also be given per tree (playout-cap randomisation mixes
    a few full, noisy searches with many fast, noise-free ones in one batch). Raises
    ValueError for a terminal root (there is nothing to search). Roots never expanded are
    evaluated first, in one batch, and that does not count as a simulation.
    """
    budgets = [simulations] * len(trees) if isinstance(simulations, (int, np.integer)) else [int(s) for s in simulations]
    noisy = [add_noise] * len(trees) if isinstance(add_noise, (bool, np.bool_)) else [bool(n) for n in add_noise]
    if len(budgets) != len(trees) or len(noisy) != len(trees):
        raise ValueError(f"{len(budgets)} budgets and {len(noisy)} noise flags for {len(trees)} trees")
    if any(b < 0 for b in budgets):
        raise ValueError(f"simulations must be >= 0, got {min(budgets)}")
    if leaves_per_round < 1:
        raise ValueError(f"leaves_per_round must be >= 1, got {leaves_per_round}")
    for tree in trees:
        if tree.root_state.is_terminal:
            raise ValueError(f"cannot search a finished game: {tree.root_state.to_text()!r}")
    _expand_roots(trees, evaluator)
    for tree, noise in zip(trees, noisy):
        if noise:
            legal = tree.root_state.legal_moves()
            tree.set_root_noise(rng.dirichlet([cfg.dirichlet_alpha] * len(legal)), cfg.dirichlet_fraction,
                                cfg.forced_playouts)

    c_puct = cfg.c_puct
    virtual = leaves_per_round > 1
    remaining = list(budgets)
    active = [t for t in range(len(trees)) if remaining[t] > 0]
    while active:
        pending: list[tuple[int, list[int], int]] = []  # (tree index, path, leaf)
        for t in active:
            tree = trees[t]
            selected = 0
            while selected < leaves_per_round and remaining[t] > 0:
                path, leaf = tree.select(c_puct)
                remaining[t] -= 1
                exact = tree.leaf_exact(leaf)
                if exact is not None:
                    tree.backup(path, exact)
                    tree.propagate_proof(path)
                    continue
                if virtual:
                    tree.add_virtual_loss(path)
                pending.append((t, path, leaf))
                selected += 1
        if pending:
            slots: dict[tuple[int, int], int] = {}
            states = []
            for t, _, leaf in pending:
                if (t, leaf) not in slots:
                    slots[(t, leaf)] = len(states)
                    states.append(trees[t].leaf_state(leaf))
            priors, values = evaluator.evaluate(states)
            for t, path, leaf in pending:
                tree = trees[t]
                j = slots[(t, leaf)]
                if not tree.is_expanded(leaf):
                    tree.expand(leaf, priors[j], float(values[j]))
                tree.backup(path, float(values[j]), virtual=virtual)
        active = [t for t in active if remaining[t] > 0]
    return [_result(tree, c_puct) for tree in trees]


def _expand_roots(trees: Sequence[SearchTree], evaluator) -> None:
    fresh = [tree for tree in trees if not tree.root_expanded()]
    if not fresh:
        return
    priors, values = evaluator.evaluate([tree.root_state for tree in fresh])
    for j, tree in enumerate(fresh):
        tree.expand_root(priors[j], float(values[j]))


def _result(tree: SearchTree, c_puct: float) -> SearchResult:
    counts = tree.root_counts()
    target = tree.pruned_counts(c_puct)  # the counts themselves unless forced playouts ran
    total = target.sum()
    if total > 0:
        visits = target / total
    else:  # no simulations were run: the prior is the best policy we have
        visits = tree.root_prior()
    return SearchResult(
        visits=visits, counts=counts, q=tree.root_q(), prior=tree.root_prior(),
        root_value=float(tree.root_value()), proven=tree.root_proven(),
        child_proven=tree.root_child_proven(),
    )
