"""The compiled steps of the array search over any game: every tree of a batch in one set of arrays.

This file is a template: `app/games/search/kernel_build.py` writes a copy of it per game, with the line
marked RULES bound to the game's compiled node rules (`Game.rules_module`, the contract in
app/games/array_rules.py), and imports that copy, so numba compiles these functions against
that game's `play`, `to_move`, `terminal`, `legal` (and `threats`) and caches them on disk.

Storage (T trees, C node slots a tree, A actions, NP seats; app/games/search/search_forest.py owns the arrays):

    edges    float64 (T, C, 3, A)   N (visits), W (summed value), P (prior) of each edge
    child    int32   (T, C, A)      node an edge leads to, -1 until selection first takes it
    words    uint64  (T, C, WORDS)  the node's position (the game's batch form)
    moves    uint8   (T, C, A)      the moves the search spreads over (legal, or what the
                                    threat check left); all 0 at a finished node
    nodes_f  float64 (T, C, 1+NP)   value at expansion (the mover's), then the node's exact
                                    value per seat (NaN: not exact): a finished game's
                                    returns, or what the solver proved
    nodes_i  int32   (T, C, 4)      ply, mover, narrowed (searched moves if the threat check
                                    narrowed them, else -1), state (-1 new, 0 finished, 1 expanded)
    trees_i  int32   (T, 2)         root node, nodes in use
    trees_f  float64 (T, A + 2)     root prior with noise mixed in, noisy (1/0), forced-playout k

Values are vectors (max^n): a leaf's value is one entry per seat, each edge's W sums the
entry of the seat that moves at the edge's node, and PUCT at a node reads its mover's entry.
For a two-player zero-sum game (value_size 1) the leaf's vector is (v, -v) from its mover's
view: exactly negamax, operation for operation and in the same float arithmetic as the
per-tree search this replaced (app/ai/search_tree.py at e1e3464), so for the same evaluator
and noise the default game's visit counts are equal (tests/test_search_equivalence.py): PUCT
with first-play urgency 0, forced playouts at a noisy root, virtual loss, the MCTS-solver's
proofs when `proofs` (a child proven lost for its mover worth the quickest win proves its
parent; all children proven: the best of them), the game's threat hook at node creation and
forced moves played through without an evaluation. With N > 2 seats only finished games are
exact unless the game turns proofs on (`Game.solver_proofs`: its results allow them); then a
node is proven by its children alone (the threat hook speaks of one opponent and is not
called), taking the exact vector of its best child for its mover: a win on the spot, or the
best of all its children proven (ties by move order, max^n's usual rule).

Why compiled (numba): a selection step is a loop over the edges per ply, a node's threat
check a few dozen 64-bit operations; as numpy calls on whole-batch arrays they cost 1-4 us per
call and ~60 calls a simulation, as a compiled loop ~1 us a simulation in all
(docs/benchmarks/search_arrays.md).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from app.games.array_rules import THREAT_LOSS, THREAT_NONE, THREAT_SAFE, THREAT_WIN, no_threats

rules = None  # RULES: kernel_build writes `import <the game's rules module> as rules` here

A = rules.NUM_ACTIONS
NP = rules.NUM_PLAYERS
WORDS = rules.WORDS
MAX_PLIES = rules.MAX_PLIES
threats = getattr(rules, "threats", no_threats)
# with a threat hook every win on the spot is proven at creation: a later proof is 3 plies away
# (two seats only: with more, the hook is not called)
THREAT_HOOK = NP == 2 and hasattr(rules, "threats")
QUICKEST_PROOF_PLIES = 3 if THREAT_HOOK else 1
N_, W_, P_ = 0, 1, 2  # rows of `edges`
VALUE, EXACT = 0, 1  # columns of `nodes_f`: the value at expansion, then NP exact values from EXACT on
PLY, MOVER, NARROWED, STATE = 0, 1, 2, 3  # columns of `nodes_i`
NEW, FINISHED, EXPANDED = -1, 0, 1  # values of `nodes_i[..., STATE]`
ROOT, COUNT = 0, 1  # columns of `trees_i`
NOISY, FORCED_K = A, A + 1  # columns of `trees_f` after the root prior
MAX_NEW_NODES = MAX_PLIES + 1  # most nodes one simulation can create (a forced line to the end)
MAX_PATH = MAX_PLIES + 1
FORCED_BONUS = 1e9  # added to a forced root move's PUCT score: above any unforced one
# columns of a pending leaf's row: tree, leaf node, path length, then the path's edges (node * A + a)
PEND_TREE, PEND_LEAF, PEND_LEN, PEND_PATH = 0, 1, 2, 3


@njit(cache=True)
def result_scale(plies, discount):
    """`app.games.base.result_scale` for this game's MAX_PLIES (the same float operations)."""
    return 1.0 - discount * plies / MAX_PLIES


@njit(cache=True)
def is_exact(t, node, nodes_f):
    return not math.isnan(nodes_f[t, node, EXACT])


@njit(cache=True)
def set_proven(t, node, mover, value, nodes_f):
    """A two-player zero-sum node proven worth `value` to its mover (and -value to the other)."""
    nodes_f[t, node, EXACT + mover] = value
    nodes_f[t, node, EXACT + 1 - mover] = -value


@njit(cache=True)
def copy_proven(t, node, c, nodes_f):
    """A node of N > 2 seats proven worth its child `c`'s exact vector."""
    for i in range(NP):
        nodes_f[t, node, EXACT + i] = nodes_f[t, c, EXACT + i]


@njit(cache=True)
def first_move(t, node, moves):
    for a in range(A):
        if moves[t, node, a]:
            return a
    return 0


@njit(cache=True)
def init_node(t, node, ply, discount, threat_check, proofs, edges, child, words, moves, nodes_f, nodes_i):
    """The facts of the position already in `words[t, node]` (finished? proven by the threat
    hook? which moves to search?), from the game's rules at once."""
    for a in range(A):
        edges[t, node, N_, a] = 0.0
        edges[t, node, W_, a] = 0.0
        edges[t, node, P_, a] = 0.0
        child[t, node, a] = -1
    w = words[t, node]
    mover = rules.to_move(w, ply)
    nodes_i[t, node, PLY] = ply
    nodes_i[t, node, MOVER] = mover
    nodes_i[t, node, NARROWED] = -1
    row = moves[t, node]
    exact = nodes_f[t, node, EXACT:]
    if rules.terminal(w, ply, exact):
        scale = result_scale(ply, discount)
        for i in range(NP):
            exact[i] = exact[i] * scale
        for a in range(A):
            row[a] = 0
        nodes_i[t, node, STATE] = FINISHED
        nodes_f[t, node, VALUE] = exact[mover]
        return
    for i in range(NP):
        exact[i] = math.nan
    nodes_i[t, node, STATE] = NEW
    code = THREAT_NONE
    if THREAT_HOOK and threat_check and proofs:
        code = threats(w, ply, row)
    if code == THREAT_WIN:
        set_proven(t, node, mover, result_scale(ply + 1, discount), nodes_f)
    elif code == THREAT_LOSS:
        set_proven(t, node, mover, -result_scale(ply + 2, discount), nodes_f)
    if code == THREAT_WIN or code == THREAT_SAFE:
        n = 0
        for a in range(A):
            n += row[a]
        nodes_i[t, node, NARROWED] = n
    else:
        rules.legal(w, ply, row)
    nodes_f[t, node, VALUE] = exact[mover] if is_exact(t, node, nodes_f) else 0.0


@njit(cache=True)
def new_child(t, node, a, discount, threat_check, proofs, edges, child, words, moves, nodes_f, nodes_i, trees_i):
    """A fresh node of tree `t` for the position after move `a` at `node`."""
    nxt = trees_i[t, COUNT]
    trees_i[t, COUNT] = nxt + 1
    rules.play(words[t, node], a, words[t, nxt])
    init_node(t, nxt, nodes_i[t, node, PLY] + 1, discount, threat_check, proofs, edges, child, words, moves,
              nodes_f, nodes_i)
    return nxt


@njit(cache=True)
def new_roots(slots, roots_words, plies, discount, threat_check, proofs, edges, child, words, moves, nodes_f,
              nodes_i, trees_i, trees_f):
    """Make each slot's tree a lone root at the given position."""
    for j in range(slots.shape[0]):
        t = slots[j]
        for i in range(WORDS):
            words[t, 0, i] = roots_words[j, i]
        trees_i[t, COUNT] = 1
        trees_i[t, ROOT] = 0
        init_node(t, 0, plies[j], discount, threat_check, proofs, edges, child, words, moves, nodes_f, nodes_i)
        trees_f[t, NOISY] = 0.0
        trees_f[t, FORCED_K] = 0.0


@njit(cache=True)
def expand(t, node, prior_row, value, moves, nodes_f, nodes_i, edges):
    """Store the evaluator's priors (renormalised over the searched moves; uniform when they
    hold nothing) and value (the mover's) for `node`."""
    total = 0.0
    count = 0
    for a in range(A):
        if moves[t, node, a]:
            total += prior_row[a]
            count += 1
    if total > 0:
        for a in range(A):
            if moves[t, node, a]:
                edges[t, node, P_, a] = prior_row[a] / total
    else:
        share = 1.0 / count
        for a in range(A):
            if moves[t, node, a]:
                edges[t, node, P_, a] = share
    nodes_i[t, node, STATE] = EXPANDED
    nodes_f[t, node, VALUE] = value


@njit(cache=True)
def expand_nodes(slots, nodes, priors, values, moves, nodes_f, nodes_i, edges):
    for j in range(slots.shape[0]):
        expand(slots[j], nodes[j], priors[j], values[j, 0], moves, nodes_f, nodes_i, edges)


@njit(cache=True)
def select(t, c_puct, discount, threat_check, proofs, path, edges, child, words, moves, nodes_f, nodes_i, trees_i,
           trees_f):
    """Descend tree `t` by PUCT to a leaf, creating the nodes it steps on; returns (path
    length, leaf). A leaf is an unexpanded node or an exact one; the root is descended even
    when proven, so a solved root still spreads its visits. A node whose one searched move is
    forced is expanded on the way (prior 1 on that move) and the descent goes on through it."""
    root = trees_i[t, ROOT]
    noisy = trees_f[t, NOISY] != 0.0
    node = root
    length = 0
    while True:
        if node != root and is_exact(t, node, nodes_f):
            return length, node
        if nodes_i[t, node, STATE] == NEW:
            if nodes_i[t, node, NARROWED] != 1:
                return length, node
            edges[t, node, P_, first_move(t, node, moves)] = 1.0  # played through: its value is its child's
            nodes_i[t, node, STATE] = EXPANDED
        total = 0.0
        for a in range(A):
            if moves[t, node, a]:
                total += edges[t, node, N_, a]
        k = c_puct * math.sqrt(total + 1.0)
        at_root_prior = node == root and noisy
        forced = trees_f[t, FORCED_K] * total if at_root_prior else 0.0
        best = -math.inf
        best_a = first_move(t, node, moves)
        for a in range(A):
            if not moves[t, node, a]:
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
            nxt = new_child(t, node, best_a, discount, threat_check, proofs, edges, child, words, moves, nodes_f,
                            nodes_i, trees_i)
            child[t, node, best_a] = nxt
        node = nxt


@njit(cache=True)
def leaf_vector(mover, row, out):
    """The evaluator's value row of a leaf (its mover's view) as one entry per seat."""
    if row.shape[0] == 1:
        out[mover] = row[0]
        out[1 - mover] = -row[0]
    else:
        for k in range(NP):
            out[(mover + k) % NP] = row[k]


@njit(cache=True)
def backup(t, path, length, values, virtual, edges, nodes_i):
    """One visit with the leaf's value vector along the path, each edge taking its node's
    mover's entry; with `virtual` the visit was already counted by the virtual loss, whose -1
    is swapped for it."""
    for i in range(length - 1, -1, -1):
        node = path[i] // A
        a = path[i] % A
        v = values[nodes_i[t, node, MOVER]]
        if virtual:
            edges[t, node, W_, a] += v + 1.0
        else:
            edges[t, node, N_, a] += 1.0
            edges[t, node, W_, a] += v


@njit(cache=True)
def propagate_proof(t, path, length, discount, threat_check, child, moves, nodes_f, nodes_i):
    """After an exact leaf at the end of the path, mark the ancestors that are now solved: a
    child proven lost for its mover worth the quickest win its parent can have (a win next
    move, or two moves ahead with the threat check, which proved every node that has one),
    or every searched child proven (the best of them). Two seats: zero-sum; more: the best
    child's vector (only for a game whose `solver_proofs` says its results allow it)."""
    plies = QUICKEST_PROOF_PLIES if threat_check else 1
    for i in range(length - 1, -1, -1):
        node = path[i] // A
        if is_exact(t, node, nodes_f):
            return
        mover = nodes_i[t, node, MOVER]
        best = -math.inf
        best_c = -1
        solved = True
        for a in range(A):
            if not moves[t, node, a]:
                continue
            c = child[t, node, a]
            if c < 0 or not is_exact(t, c, nodes_f):
                solved = False
                continue
            pv = nodes_f[t, c, EXACT + mover]
            if pv > best:
                best = pv
                best_c = c
        quickest = result_scale(nodes_i[t, node, PLY] + plies, discount)
        if (solved and best > -math.inf) or (best > 0.0 and best >= quickest):
            if NP == 2:
                set_proven(t, node, mover, best, nodes_f)
            else:
                copy_proven(t, node, best_c, nodes_f)
        else:
            return


@njit(cache=True)
def select_round(active, start, remaining, selected, per_round, virtual, c_puct, discount, threat_check, proofs,
                 pending, n_pending, slot_of, unique, n_unique, capacity,
                 edges, child, words, moves, nodes_f, nodes_i, trees_i, trees_f):
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
            length, leaf = select(t, c_puct, discount, threat_check, proofs, path, edges, child, words, moves,
                                  nodes_f, nodes_i, trees_i, trees_f)
            remaining[t] -= 1
            if is_exact(t, leaf, nodes_f):
                backup(t, path, length, nodes_f[t, leaf, EXACT:], False, edges, nodes_i)
                if proofs:
                    propagate_proof(t, path, length, discount, threat_check, child, moves, nodes_f, nodes_i)
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
def expand_and_backup(pending, n_pending, slot_of, unique, priors, values, virtual, edges, moves, nodes_f, nodes_i):
    """The evaluator's answers for a round's leaves (`values` (B, value_size), each leaf's
    mover's view): expand each leaf once, back every pending simulation up."""
    vec = np.empty(NP)
    for p in range(n_pending):
        t = pending[p, PEND_TREE]
        leaf = pending[p, PEND_LEAF]
        j = slot_of[p]
        if nodes_i[t, leaf, STATE] == NEW:
            expand(t, leaf, priors[j], values[j, 0], moves, nodes_f, nodes_i, edges)
        leaf_vector(nodes_i[t, leaf, MOVER], values[j], vec)
        backup(t, pending[p, PEND_PATH:], pending[p, PEND_LEN], vec, virtual, edges, nodes_i)


@njit(cache=True)
def set_root_noise(t, noise, fraction, forced_k, edges, moves, trees_i, trees_f):
    """Mix `noise` (one value per searched root move, in order) into a copy of the root prior;
    the stored prior stays as the evaluator gave it, so reuse never compounds noise."""
    root = trees_i[t, ROOT]
    for a in range(A):
        trees_f[t, a] = edges[t, root, P_, a]
    i = 0
    for a in range(A):
        if moves[t, root, a]:
            trees_f[t, a] = (1.0 - fraction) * trees_f[t, a] + fraction * noise[i]
            i += 1
    trees_f[t, NOISY] = 1.0
    trees_f[t, FORCED_K] = forced_k


@njit(cache=True)
def root_summary(slots, counts, q, prior, root_value, proven, child_proven, edges, child, nodes_f, nodes_i, trees_i):
    """Each slot's root: visit counts, mean values (0 where unvisited), priors, the search
    value (exact when proven, else W/N summed over the moves in order, else the evaluator's),
    and each move's exact value for the root's mover where its child is exact (NaN elsewhere)."""
    for j in range(slots.shape[0]):
        t = slots[j]
        root = trees_i[t, ROOT]
        mover = nodes_i[t, root, MOVER]
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
            child_proven[j, a] = nodes_f[t, c, EXACT + mover] if c >= 0 else math.nan
        proven[j] = nodes_f[t, root, EXACT + mover]
        if not math.isnan(proven[j]):
            root_value[j] = proven[j]
        elif n_sum == 0:
            root_value[j] = nodes_f[t, root, VALUE]
        else:
            root_value[j] = w_sum / n_sum


@njit(cache=True)
def advance(t, action, discount, threat_check, proofs, keep, edges, child, words, moves, nodes_f, nodes_i, trees_i,
            trees_f):
    """Make the child after `action` the root of tree `t`, keeping its subtree's statistics,
    and pack that subtree into the first node slots (in creation order, so every node moves
    down or stays: the copy is safe in place). `keep` is scratch of the tree's node capacity."""
    root = trees_i[t, ROOT]
    nxt = child[t, root, action]
    if nxt < 0:
        nxt = new_child(t, root, action, discount, threat_check, proofs, edges, child, words, moves, nodes_f,
                        nodes_i, trees_i)
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
            moves[t, j, a] = moves[t, i, a]
        for k in range(WORDS):
            words[t, j, k] = words[t, i, k]
        for k in range(1 + NP):
            nodes_f[t, j, k] = nodes_f[t, i, k]
        for k in range(4):
            nodes_i[t, j, k] = nodes_i[t, i, k]
    trees_i[t, ROOT] = keep[nxt]
    trees_i[t, COUNT] = new_id
    trees_f[t, NOISY] = 0.0
    trees_f[t, FORCED_K] = 0.0
