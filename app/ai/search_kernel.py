"""The compiled steps of the array search: every tree of a batch in one set of arrays.

Storage (T trees, C node slots a tree, A actions; app/ai/search_forest.py owns the arrays):

    edges    float64 (T, C, 3, A)   N (visits), W (summed value), P (prior) of each edge
    child    int32   (T, C, A)      node an edge leads to, -1 until selection first takes it
    words    uint64  (T, C, 2)      the node's position (Connect Four's batch form)
    nodes_f  float64 (T, C, 2)      proven value (NaN: not proven), value at expansion
    nodes_i  int32   (T, C, 3)      ply, moves (bit mask the threat check left; -1: all),
                                    legal (bit mask of searched moves once expanded; -1: not yet)
    trees_i  int32   (T, 2)         root node, nodes in use
    trees_f  float64 (T, A + 2)     root prior with noise mixed in, noisy (1/0), forced-playout k

Values are from the view of the side to move at the node that owns the edge; backup negates
once per ply. These are the rules of the per-tree search this replaced (app/ai/search_tree.py
at e1e3464) operation for operation, in the same order and the same float arithmetic, so for
the same evaluator and noise the visit counts are equal (tests/test_search_equivalence.py):
PUCT with first-play urgency 0, forced playouts at a noisy root, virtual loss, the
MCTS-solver's proofs (a child proven lost for its mover worth the quickest win proves its
parent; all children proven: the best of them), the threat check at node creation and forced
moves played through without an evaluation.

Why compiled (numba): a selection step is a loop over 7 edges per ply, a node's threat check a
few dozen 64-bit operations; as numpy calls on whole-batch arrays they cost 1-4 us per call
and ~60 calls a simulation, as a compiled loop ~1 us a simulation in all
(docs/benchmarks/search_arrays.md). Each function is cached on disk (`cache=True`), so a new
worker process loads it instead of compiling.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from app.games import connect4_arrays as rules

A = rules.WIDTH
N_, W_, P_ = 0, 1, 2  # rows of `edges`
PROVEN, VALUE = 0, 1  # columns of `nodes_f`
PLY, MOVES, LEGAL = 0, 1, 2  # columns of `nodes_i`
ROOT, COUNT = 0, 1  # columns of `trees_i`
NOISY, FORCED_K = A, A + 1  # columns of `trees_f` after the root prior
MAX_NEW_NODES = rules.MAX_PLIES + 1  # most nodes one simulation can create (a forced line to the end)
MAX_PATH = rules.MAX_PLIES + 1
FORCED_BONUS = 1e9  # added to a forced root move's PUCT score: above any unforced one
# columns of a pending leaf's row: tree, leaf node, path length, then the path's edges (node * A + a)
PEND_TREE, PEND_LEAF, PEND_LEN, PEND_PATH = 0, 1, 2, 3


@njit(cache=True)
def popcount(bits: np.int64) -> np.int64:
    n = 0
    while bits:
        bits &= bits - 1
        n += 1
    return n


@njit(cache=True)
def lowest(bits: np.int64) -> np.int64:
    a = 0
    while not (bits >> a) & 1:
        a += 1
    return a


@njit(cache=True)
def new_node(t, position, mask, ply, discount, threat_check, edges, child, words, nodes_f, nodes_i, trees_i):
    """Store a position as a fresh node of tree `t`; its facts (finished? proven by the threat
    check? which moves to search?) come from the game's rules at once."""
    node = trees_i[t, COUNT]
    trees_i[t, COUNT] = node + 1
    for a in range(A):
        edges[t, node, N_, a] = 0.0
        edges[t, node, W_, a] = 0.0
        edges[t, node, P_, a] = 0.0
        child[t, node, a] = -1
    words[t, node, 0] = position
    words[t, node, 1] = mask
    proven, moves, legal = rules.node_facts(position, mask, ply, discount, threat_check)
    nodes_f[t, node, PROVEN] = proven
    nodes_f[t, node, VALUE] = 0.0 if math.isnan(proven) else proven
    nodes_i[t, node, PLY] = ply
    nodes_i[t, node, MOVES] = moves
    nodes_i[t, node, LEGAL] = legal
    return node


@njit(cache=True)
def new_roots(slots, roots_words, plies, discount, threat_check, edges, child, words, nodes_f, nodes_i, trees_i,
              trees_f):
    """Make each slot's tree a lone root at the given position."""
    for j in range(slots.shape[0]):
        t = slots[j]
        trees_i[t, COUNT] = 0
        trees_i[t, ROOT] = new_node(t, roots_words[j, 0], roots_words[j, 1], plies[j], discount, threat_check,
                                    edges, child, words, nodes_f, nodes_i, trees_i)
        trees_f[t, NOISY] = 0.0
        trees_f[t, FORCED_K] = 0.0


@njit(cache=True)
def expand(t, node, prior_row, value, edges, words, nodes_f, nodes_i):
    """Store the evaluator's priors (renormalised over the searched moves; uniform when they
    hold nothing) and value for `node`."""
    legal = nodes_i[t, node, MOVES]
    if legal < 0:
        legal = rules.legal_bits(words[t, node, 1])
    total = 0.0
    for a in range(A):
        if (legal >> a) & 1:
            total += prior_row[a]
    if total > 0:
        for a in range(A):
            if (legal >> a) & 1:
                edges[t, node, P_, a] = prior_row[a] / total
    else:
        share = 1.0 / popcount(legal)
        for a in range(A):
            if (legal >> a) & 1:
                edges[t, node, P_, a] = share
    nodes_i[t, node, LEGAL] = legal
    nodes_f[t, node, VALUE] = value


@njit(cache=True)
def expand_nodes(slots, nodes, priors, values, edges, words, nodes_f, nodes_i):
    for j in range(slots.shape[0]):
        expand(slots[j], nodes[j], priors[j], values[j], edges, words, nodes_f, nodes_i)


@njit(cache=True)
def select(t, c_puct, discount, threat_check, path, edges, child, words, nodes_f, nodes_i, trees_i, trees_f):
    """Descend tree `t` by PUCT to a leaf, creating the nodes it steps on; returns (path
    length, leaf). A leaf is an unexpanded node or a proven one; the root is descended even
    when proven, so a solved root still spreads its visits. A node whose one searched move is
    forced is expanded on the way (prior 1 on that move) and the descent goes on through it."""
    root = trees_i[t, ROOT]
    noisy = trees_f[t, NOISY] != 0.0
    node = root
    length = 0
    while True:
        if node != root and not math.isnan(nodes_f[t, node, PROVEN]):
            return length, node
        legal = nodes_i[t, node, LEGAL]
        if legal < 0:
            moves = nodes_i[t, node, MOVES]
            if moves < 0 or popcount(moves) != 1:
                return length, node
            edges[t, node, P_, lowest(moves)] = 1.0  # played through: its value is its child's
            nodes_i[t, node, LEGAL] = moves
            legal = moves
        total = 0.0
        for a in range(A):
            if (legal >> a) & 1:
                total += edges[t, node, N_, a]
        k = c_puct * math.sqrt(total + 1.0)
        at_root_prior = node == root and noisy
        forced = trees_f[t, FORCED_K] * total if at_root_prior else 0.0
        best = -math.inf
        best_a = lowest(legal)
        for a in range(A):
            if not (legal >> a) & 1:
                continue
            n = edges[t, node, N_, a]
            p = trees_f[t, a] if at_root_prior else edges[t, node, P_, a]
            score = (edges[t, node, W_, a] / n if n != 0.0 else 0.0) + k * p / (1.0 + n)
            if forced != 0.0 and n * n < forced * p:  # fewer than sqrt(k * p * N) visits: forced
                score += FORCED_BONUS
            if score > best:
                best = score
                best_a = a
        path[length] = node * A + best_a
        length += 1
        nxt = child[t, node, best_a]
        if nxt < 0:
            position, mask = rules.play(words[t, node, 0], words[t, node, 1], best_a)
            nxt = new_node(t, position, mask, nodes_i[t, node, PLY] + 1, discount, threat_check, edges, child, words,
                           nodes_f, nodes_i, trees_i)
            child[t, node, best_a] = nxt
        node = nxt


@njit(cache=True)
def backup(t, path, length, value, virtual, edges):
    """One visit with the leaf's value (its side to move's view) along the path; with
    `virtual` the visit was already counted by the virtual loss, whose -1 is swapped for it."""
    v = value
    for i in range(length - 1, -1, -1):
        node = path[i] // A
        a = path[i] % A
        v = -v
        if virtual:
            edges[t, node, W_, a] += v + 1.0
        else:
            edges[t, node, N_, a] += 1.0
            edges[t, node, W_, a] += v


@njit(cache=True)
def propagate_proof(t, path, length, discount, threat_check, child, nodes_f, nodes_i):
    """After an exact leaf at the end of the path, mark the ancestors that are now solved: a
    child proven lost for its mover worth the quickest win its parent can have (a win next
    move, or two moves ahead with the threat check, which proved every node that has one),
    or every searched child proven (the best of them)."""
    plies = 3 if threat_check else 1
    for i in range(length - 1, -1, -1):
        node = path[i] // A
        if not math.isnan(nodes_f[t, node, PROVEN]):
            return
        legal = nodes_i[t, node, LEGAL]
        best = -math.inf
        solved = True
        for a in range(A):
            if not (legal >> a) & 1:
                continue
            c = child[t, node, a]
            if c < 0 or math.isnan(nodes_f[t, c, PROVEN]):
                solved = False
                continue
            pv = -nodes_f[t, c, PROVEN]
            if pv > best:
                best = pv
        quickest = rules.result_scale(nodes_i[t, node, PLY] + plies, discount)
        if (solved and best > -math.inf) or (best > 0.0 and best >= quickest):
            nodes_f[t, node, PROVEN] = best
        else:
            return


@njit(cache=True)
def select_round(active, start, remaining, selected, per_round, virtual, c_puct, discount, threat_check,
                 pending, n_pending, slot_of, unique, n_unique, capacity,
                 edges, child, words, nodes_f, nodes_i, trees_i, trees_f):
    """One round's selections in every active tree, from `active[start]` on: up to
    `per_round` leaves a tree that need the evaluator (pending, with virtual loss when several),
    each simulation that ends on an exact leaf backed up and its proof spread on the spot.

    Returns (pending, unique leaves, -1), or the index in `active` of a tree that could run out
    of node slots: the caller grows the arrays and calls again from there (the counters in
    `remaining`, `selected`, `pending` carry over, so the round is the same as without a stop).
    """
    for j in range(start, active.shape[0]):
        t = active[j]
        while selected[t] < per_round and remaining[t] > 0:
            if trees_i[t, COUNT] + MAX_NEW_NODES > capacity:
                return n_pending, n_unique, j
            path = pending[n_pending, PEND_PATH:]
            length, leaf = select(t, c_puct, discount, threat_check, path, edges, child, words, nodes_f, nodes_i,
                                  trees_i, trees_f)
            remaining[t] -= 1
            exact = nodes_f[t, leaf, PROVEN]
            if not math.isnan(exact):
                backup(t, path, length, exact, False, edges)
                propagate_proof(t, path, length, discount, threat_check, child, nodes_f, nodes_i)
                continue
            if virtual:
                for i in range(length):
                    node = path[i] // A
                    a = path[i] % A
                    edges[t, node, N_, a] += 1.0
                    edges[t, node, W_, a] -= 1.0
            pending[n_pending, PEND_TREE] = t
            pending[n_pending, PEND_LEAF] = leaf
            pending[n_pending, PEND_LEN] = length
            slot = -1
            for q in range(n_unique - 1, -1, -1):  # the same leaf twice in a round: evaluated once
                if unique[q, 0] != t:
                    break
                if unique[q, 1] == leaf:
                    slot = q
                    break
            if slot < 0:
                slot = n_unique
                unique[slot, 0] = t
                unique[slot, 1] = leaf
                n_unique += 1
            slot_of[n_pending] = slot
            n_pending += 1
            selected[t] += 1
    return n_pending, n_unique, -1


@njit(cache=True)
def expand_and_backup(pending, n_pending, slot_of, unique, priors, values, virtual, edges, words, nodes_f, nodes_i):
    """The evaluator's answers for a round's leaves: expand each leaf once, back every
    pending simulation up."""
    for p in range(n_pending):
        t = pending[p, PEND_TREE]
        leaf = pending[p, PEND_LEAF]
        j = slot_of[p]
        if nodes_i[t, leaf, LEGAL] < 0:
            expand(t, leaf, priors[j], values[j], edges, words, nodes_f, nodes_i)
        backup(t, pending[p, PEND_PATH:], pending[p, PEND_LEN], values[j], virtual, edges)


@njit(cache=True)
def set_root_noise(t, noise, fraction, forced_k, edges, nodes_i, trees_i, trees_f):
    """Mix `noise` (one value per searched root move, in order) into a copy of the root prior;
    the stored prior stays as the evaluator gave it, so reuse never compounds noise."""
    root = trees_i[t, ROOT]
    legal = nodes_i[t, root, LEGAL]
    for a in range(A):
        trees_f[t, a] = edges[t, root, P_, a]
    i = 0
    for a in range(A):
        if (legal >> a) & 1:
            trees_f[t, a] = (1.0 - fraction) * trees_f[t, a] + fraction * noise[i]
            i += 1
    trees_f[t, NOISY] = 1.0
    trees_f[t, FORCED_K] = forced_k


@njit(cache=True)
def root_summary(slots, counts, q, prior, root_value, proven, child_proven, edges, child, nodes_f, trees_i):
    """Each slot's root: visit counts, mean values (0 where unvisited), priors, the search
    value (exact when proven, else W/N summed over the moves in order, else the evaluator's),
    and each move's exact value from the root's view where its child is proven (NaN elsewhere)."""
    for j in range(slots.shape[0]):
        t = slots[j]
        root = trees_i[t, ROOT]
        n_sum = 0.0
        w_sum = 0.0
        for a in range(A):
            n = edges[t, root, N_, a]
            w = edges[t, root, W_, a]
            counts[j, a] = n
            q[j, a] = w / n if n > 0 else 0.0
            prior[j, a] = edges[t, root, P_, a]
            n_sum += n
            w_sum += w
            c = child[t, root, a]
            child_proven[j, a] = -nodes_f[t, c, PROVEN] if c >= 0 else math.nan
        proven[j] = nodes_f[t, root, PROVEN]
        if not math.isnan(proven[j]):
            root_value[j] = proven[j]
        elif n_sum == 0:
            root_value[j] = nodes_f[t, root, VALUE]
        else:
            root_value[j] = w_sum / n_sum


@njit(cache=True)
def advance(t, action, discount, threat_check, keep, edges, child, words, nodes_f, nodes_i, trees_i, trees_f):
    """Make the child after `action` the root of tree `t`, keeping its subtree's statistics,
    and pack that subtree into the first node slots (in creation order, so every node moves
    down or stays: the copy is safe in place). `keep` is scratch of the tree's node capacity."""
    root = trees_i[t, ROOT]
    nxt = child[t, root, action]
    if nxt < 0:
        position, mask = rules.play(words[t, root, 0], words[t, root, 1], action)
        nxt = new_node(t, position, mask, nodes_i[t, root, PLY] + 1, discount, threat_check, edges, child, words,
                       nodes_f, nodes_i, trees_i)
    count = trees_i[t, COUNT]
    for i in range(count):
        keep[i] = -1
    keep[nxt] = 0
    stack = [nxt]
    while len(stack):
        node = stack.pop()
        for a in range(A):
            c = child[t, node, a]
            if c >= 0 and keep[c] < 0:
                keep[c] = 0
                stack.append(c)
    new_id = 0
    for i in range(count):  # old ids ascending: a node's new id is never above its old one
        if keep[i] >= 0:
            keep[i] = new_id
            new_id += 1
    for i in range(count):
        j = keep[i]
        if j < 0:
            continue
        for a in range(A):
            edges[t, j, N_, a] = edges[t, i, N_, a]
            edges[t, j, W_, a] = edges[t, i, W_, a]
            edges[t, j, P_, a] = edges[t, i, P_, a]
            c = child[t, i, a]
            child[t, j, a] = keep[c] if c >= 0 else -1
        words[t, j, 0] = words[t, i, 0]
        words[t, j, 1] = words[t, i, 1]
        nodes_f[t, j, PROVEN] = nodes_f[t, i, PROVEN]
        nodes_f[t, j, VALUE] = nodes_f[t, i, VALUE]
        nodes_i[t, j, PLY] = nodes_i[t, i, PLY]
        nodes_i[t, j, MOVES] = nodes_i[t, i, MOVES]
        nodes_i[t, j, LEGAL] = nodes_i[t, i, LEGAL]
    trees_i[t, ROOT] = keep[nxt]
    trees_i[t, COUNT] = new_id
    trees_f[t, NOISY] = 0.0
    trees_f[t, FORCED_K] = 0.0
