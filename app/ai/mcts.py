"""PUCT Monte Carlo tree search, batched across many trees (games) per evaluator call.

A CPU or GPU evaluates a batch of 64 positions far faster per position than one at a time,
so the driver advances many independent trees in lock step: each round it selects one leaf
per tree (or several, with virtual loss, when `leaves_per_round` > 1, for a single big
search), values terminal and proven leaves exactly on the spot, evaluates all other leaves in
ONE `evaluator.evaluate` call, then expands and backs up.

Public API (self-play, the gauntlet players and app.analyze use exactly this):

    tree = SearchTree(state)                       # app/ai/search_tree.py
    [result] = run_searches([tree], evaluator, simulations, cfg, rng, add_noise=False)
    action = choose_action(result.visits, temperature_for_ply(ply, cfg.temperature_moves), rng)
    tree.advance(action)                           # reuse: the chosen subtree's visits stay

`simulations` new simulations are run per call (reused visits come on top). Dirichlet noise
(cfg.dirichlet_alpha, cfg.dirichlet_fraction) is mixed into the root prior only, and only
when `add_noise` is set (self-play), never stored into the tree; with it, cfg.forced_playouts
> 0 forces visits to every root move the noise favours and `visits` (the policy target) is
the counts with those visits pruned out again (SearchTree.pruned_counts).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from app.ai.evaluators import Evaluator
from app.ai.search_tree import SearchTree
from app.config.pipeline import SearchConfig

__all__ = [
    "SearchResult", "SearchTree", "choose_action", "run_searches", "search", "temperature_for_ply",
]


@dataclass(frozen=True)
class SearchResult:
    """What a search says about its root, every array of length num_actions.

    visits: normalised root visit distribution (the policy training target);
    counts: raw root visit counts; q: mean value per root move from the side to move
    (0 where unvisited); prior: the evaluator's prior at the root (no noise);
    root_value: search value of the root, side to move's view (exact when proven);
    proven: the root's exact value when the search solved it, else None;
    child_proven: each move's exact value from the root's view where its child is solved,
    NaN elsewhere.
    """

    visits: np.ndarray
    counts: np.ndarray
    q: np.ndarray
    prior: np.ndarray
    root_value: float
    proven: float | None
    child_proven: np.ndarray | None = None

    @property
    def best_action(self) -> int:
        """Most visited move; ties go to the higher prior, then the lower index. A solved root
        plays a move its proof rests on: visits can still favour a slower win (a proven
        child's visits back up an exact value, others the network's guesses)."""
        counts = self.counts
        if self.proven is not None and self.child_proven is not None:
            proving = np.isclose(self.child_proven, self.proven, rtol=0.0, atol=1e-9)
            if proving.any():
                counts = np.where(proving, counts + 1.0, -1.0)
        top = np.flatnonzero(counts == counts.max())
        return int(top[np.argmax(self.prior[top])])


def temperature_for_ply(ply: int, temperature_moves: int) -> float:
    """1.0 for the first `temperature_moves` plies of a game (exploration), then 0 (greedy)."""
    return 1.0 if ply < temperature_moves else 0.0


def choose_action(visits: np.ndarray, temperature: float, rng: np.random.Generator) -> int:
    """Sample a move with probability proportional to visits^(1/temperature).

    Temperature 0 plays a most visited move, breaking ties at random so greedy self-play
    games still differ.
    """
    visits = np.asarray(visits, dtype=np.float64)
    if visits.sum() <= 0:
        raise ValueError("choose_action needs at least one visited move")
    if temperature <= 0:
        top = np.flatnonzero(visits == visits.max())
        return int(top[rng.integers(len(top))]) if len(top) > 1 else int(top[0])
    weights = visits ** (1.0 / temperature) if temperature != 1.0 else visits
    return int(rng.choice(len(weights), p=weights / weights.sum()))


def run_searches(
    trees: Sequence[SearchTree],
    evaluator: Evaluator,
    simulations: int | Sequence[int],
    cfg: SearchConfig,
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


def search(
    state_or_tree, evaluator: Evaluator, simulations: int, cfg: SearchConfig,
    rng: np.random.Generator | None = None, add_noise: bool = False, leaves_per_round: int = 1,
) -> SearchResult:
    """One search of one position (or tree): a convenience over `run_searches`."""
    tree = (state_or_tree if isinstance(state_or_tree, SearchTree)
            else SearchTree.for_search(state_or_tree, cfg))
    rng = rng if rng is not None else np.random.default_rng()
    return run_searches([tree], evaluator, simulations, cfg, rng, add_noise, leaves_per_round)[0]


def _expand_roots(trees: Sequence[SearchTree], evaluator: Evaluator) -> None:
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
