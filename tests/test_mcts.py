"""PUCT search on real positions: wins, blocks, terminal states, noise, reuse, batching
(the array search, app/games/search/search_forest.py; its equality with the per-tree search it replaced:
tests/test_search_equivalence.py)."""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from app.games.search.evaluators import NetworkEvaluator, RolloutEvaluator, UniformEvaluator
from app.games.search.mcts import SearchForest, SearchResult, choose_action, search, temperature_for_ply
from app.games.search.model import Architecture, new_model
from app.config import SearchConfig
from app.games import IllegalMoveError, get_game, result_scale
from app.games.train.solved_eval import ScoredPosition, load_positions
from tests.conftest import PONS_DIR

GAME = get_game("connect4")
CFG = SearchConfig()


def winning_moves(state) -> list[int]:
    return [m for m in state.legal_moves() if state.play(m).is_terminal and state.play(m).winner is not None]


def opponent_can_win(state) -> bool:
    return any(winning_moves(state))


@lru_cache(maxsize=1)
def pons_positions() -> tuple[list, list]:
    """(positions with an immediate win, [(position, its one move that does not allow an
    immediate loss)]), from Pons' benchmark positions that he scores as not lost.

    His files hold no immediate wins, so those are made from the block positions: any other
    move there hands the opponent a win.
    """
    files = sorted(PONS_DIR.glob("Test_*"))
    if not files:  # a missing benchmark dir must fail the tests that loop over it, not empty them
        raise FileNotFoundError(f"{PONS_DIR}: no Test_* files of Pons' benchmark positions")
    wins, blocks = [], []
    for path in files:
        for line in path.read_text().splitlines():
            moves, score = line.split()
            state = GAME.parse(moves)
            if int(score) < 0 or len(state.legal_moves()) < 3 or winning_moves(state):
                continue
            safe = [m for m in state.legal_moves() if not opponent_can_win(state.play(m))]
            if len(safe) != 1:
                continue
            blocks.append((state, safe[0]))
            wins.append(state.play(next(m for m in state.legal_moves() if m != safe[0])))
            if len(blocks) >= 6:
                return wins, blocks
    raise AssertionError(f"only {len(blocks)} tactical positions in {PONS_DIR}, 6 expected")


def test_pons_files_give_enough_tactical_positions() -> None:
    wins, blocks = pons_positions()
    assert len(wins) == len(blocks) == 6


@pytest.mark.parametrize("kind", ["uniform", "rollout"])
def test_finds_an_immediate_win(kind: str) -> None:
    rng = np.random.default_rng(0)
    evaluator = UniformEvaluator(GAME) if kind == "uniform" else RolloutEvaluator(GAME, 8, rng)
    positions = pons_positions()[0]
    assert len(positions) == 6  # never a loop over nothing
    for state in positions:
        result = search(state, evaluator, 48, CFG, rng)
        assert result.best_action in winning_moves(state), state.to_text()
        # a win on the next move, worth what the length discount leaves of it
        quickest = result_scale(state.ply + 1, state.max_plies, CFG.length_discount)
        assert result.proven == quickest and result.root_value == quickest


@pytest.mark.parametrize("kind", ["uniform", "rollout"])
def test_blocks_an_immediate_loss(kind: str) -> None:
    rng = np.random.default_rng(1)
    evaluator = UniformEvaluator(GAME) if kind == "uniform" else RolloutEvaluator(GAME, 8, rng)
    positions = pons_positions()[1]
    assert len(positions) == 6  # never a loop over nothing
    for state, block in positions:
        result = search(state, evaluator, 150, CFG, rng)
        assert result.best_action == block, (state.to_text(), result.counts)


def test_a_lost_position_is_proven_lost() -> None:
    # The first player has 4,5,6 on the bottom row with both ends open: a double threat.
    state = GAME.parse("4455661")
    result = search(state, UniformEvaluator(GAME), 200, CFG, np.random.default_rng(0))
    # whatever the second player does, the first wins with ply 9: the latest loss there is
    latest_loss = -result_scale(9, state.max_plies, CFG.length_discount)
    assert result.proven == latest_loss and result.root_value == latest_loss


def solver_value(position: ScoredPosition, length_discount: float) -> float:
    """The solver's score of a position as the search's exact value: a Pons score s != 0 means
    the winner wins with its (22 - |s|)-th stone, so the game lasts that many of its moves."""
    if position.best == 0:
        return 0.0
    mover = position.ply % 2
    winner = mover if position.best > 0 else 1 - mover
    stones = 22 - abs(position.best)
    plies = 2 * stones - 1 if winner == 0 else 2 * stones
    return (1.0 if position.best > 0 else -1.0) * result_scale(plies, 42, length_discount)


def test_with_a_length_discount_proven_values_are_the_solvers_scores() -> None:
    """A quicker win is worth more and a later loss costs less; only an immediate win proves a
    node on its own, so whatever the search proves is exact, not a bound."""
    cfg = SearchConfig(length_discount=0.5)
    late = [p for p in load_positions(PONS_DIR / "move_scores.txt") if p.ply >= 30]
    forest = SearchForest(GAME, cfg.length_discount)  # no threat check: proofs from the search alone
    slots = [forest.add(GAME.parse(p.moves)) for p in late]
    results = forest.search(slots, UniformEvaluator(GAME), 4000, cfg, np.random.default_rng(0))
    proven = [(p, r) for p, r in zip(late, results) if r.proven is not None]
    assert len(proven) >= len(late) // 2, f"only {len(proven)} of {len(late)} late positions proven"
    assert {p.best > 0 for p, _ in proven} == {True, False}, "both won and lost positions must be proven"
    for p, r in proven:
        assert r.proven == pytest.approx(solver_value(p, cfg.length_discount)), p.moves
        assert p.is_exact(r.best_action), p.moves
    assert GAME.parse("1212121").terminal_value(0.5) == pytest.approx(-(1 - 0.5 * 7 / 42))


def test_the_threat_check_proves_more_and_every_proof_is_the_solvers_score() -> None:
    """Proofs one ply deep by the rules come without network calls and prune only moves that
    lose at once, so the same budget proves more late positions, each still exact."""
    late = [p for p in load_positions(PONS_DIR / "move_scores.txt") if p.ply >= 24]
    proven_by = {}
    for threat_check in (False, True):
        cfg = SearchConfig(length_discount=0.75, threat_check=threat_check)
        forest = SearchForest.for_search(GAME, cfg)
        slots = [forest.add(GAME.parse(p.moves)) for p in late]
        results = forest.search(slots, UniformEvaluator(GAME), 300, cfg, np.random.default_rng(0))
        proven = [(p, r) for p, r in zip(late, results) if r.proven is not None]
        for p, r in proven:
            assert r.proven == pytest.approx(solver_value(p, cfg.length_discount)), p.moves
            assert p.is_exact(r.best_action), p.moves
        proven_by[threat_check] = len(proven)
    assert proven_by[True] >= proven_by[False] + len(late) // 10, proven_by


def test_the_threat_check_searches_only_safe_moves_and_proves_forced_losses_on_the_spot() -> None:
    cfg = SearchConfig(threat_check=True)
    for state, block in pons_positions()[1]:  # one safe move: the block
        result = search(state, UniformEvaluator(GAME), 20, cfg, np.random.default_rng(0))
        assert np.flatnonzero(result.counts).tolist() == [block], (state.to_text(), result.counts)
        assert result.visits[block] == 1.0
    # a double threat against the side to move: lost in two plies, known before any simulation
    state = GAME.parse("4455661")
    evaluator = UniformEvaluator(GAME)
    result = search(state, evaluator, 1, cfg, np.random.default_rng(0))
    assert result.proven == -result_scale(state.ply + 2, state.max_plies, cfg.length_discount)
    assert evaluator.positions == 1  # the root's expansion only


def test_a_solved_root_plays_the_move_its_proof_rests_on() -> None:
    """Visits can favour a slower win; the proof names the quicker one."""
    counts = np.array([0.0, 30.0, 10.0, 0.0, 0.0, 0.0, 0.0])
    child_proven = np.array([np.nan, 0.5, 0.7, np.nan, np.nan, np.nan, np.nan])
    result = SearchResult(visits=counts / 40, counts=counts, q=np.zeros(7), prior=np.full(7, 1 / 7),
                          root_value=0.7, proven=0.7, child_proven=child_proven)
    assert result.best_action == 2
    unsolved = SearchResult(visits=counts / 40, counts=counts, q=np.zeros(7), prior=np.full(7, 1 / 7),
                            root_value=0.6, proven=None, child_proven=child_proven)
    assert unsolved.best_action == 1


def test_last_move_draw_is_exact_and_needs_no_evaluation() -> None:
    rng = random.Random(3)
    while True:
        moves, state = [], GAME.initial_state()
        while not state.is_terminal:
            moves.append(rng.choice(state.legal_moves()))
            state = state.play(moves[-1])
        if state.winner is None:
            break
    before = GAME.initial_state()
    for m in moves[:-1]:
        before = before.play(m)
    evaluator = UniformEvaluator(GAME)
    result = search(before, evaluator, 10, CFG, np.random.default_rng(0))
    assert result.proven == 0.0 and result.root_value == 0.0
    assert result.counts.sum() == 10 and result.visits[moves[-1]] == 1.0
    assert evaluator.positions == 1  # only the root; the terminal child is valued exactly


def test_terminal_root_is_refused() -> None:
    with pytest.raises(ValueError, match="finished game"):
        search(GAME.parse("1212121"), UniformEvaluator(GAME), 8, CFG)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 30), st.integers(1, 40))
def test_visits_are_a_distribution_over_legal_moves(seed: int, plies: int, sims: int) -> None:
    r = random.Random(seed)
    state = GAME.initial_state()
    for _ in range(plies):
        nxt = state.play(r.choice(state.legal_moves()))
        if nxt.is_terminal:
            break
        state = nxt
    result = search(state, UniformEvaluator(GAME), sims, CFG, np.random.default_rng(seed), add_noise=True)
    assert result.counts.sum() == sims
    assert abs(result.visits.sum() - 1.0) < 1e-9
    assert np.all(result.visits[~state.legal_mask()] == 0)
    assert -1.0 <= result.root_value <= 1.0
    assert state.legal_mask()[result.best_action]


def test_noise_changes_the_root_only_and_is_never_stored() -> None:
    state = GAME.parse("44")
    noisy_cfg = SearchConfig(dirichlet_alpha=0.05, dirichlet_fraction=0.9)
    plain = search(state, UniformEvaluator(GAME), 64, noisy_cfg, np.random.default_rng(0))
    forest = SearchForest(GAME)
    slot = forest.add(state)
    noisy = forest.search([slot], UniformEvaluator(GAME), 64, noisy_cfg, np.random.default_rng(0), add_noise=True)[0]
    uniform = state.legal_mask() / state.legal_mask().sum()
    assert np.allclose(noisy.prior, uniform) and np.allclose(plain.prior, uniform)
    assert not np.allclose(forest.noisy_root_prior(slot), uniform)
    assert not np.array_equal(noisy.counts, plain.counts)  # the root was steered by the noise
    action = int(np.argmax(noisy.counts))
    forest.advance(slot, action)
    child = forest.root_state(slot)
    assert forest.noisy_root_prior(slot) is None
    assert np.allclose(forest.root_prior(slot), child.legal_mask() / child.legal_mask().sum())


def test_tree_reuse_keeps_the_subtree_visits() -> None:
    forest = SearchForest(GAME, capacity=32)  # small: the tree grows its arrays on the way
    slot = forest.add(GAME.parse("4"))
    evaluator = UniformEvaluator(GAME)
    first = forest.search([slot], evaluator, 100, CFG, np.random.default_rng(0))[0]
    action = first.best_action
    nodes = forest.node_count(slot)
    forest.advance(slot, action)
    kept = forest.root_counts(slot).sum()
    assert kept == first.counts[action] - 1  # every visit but the one that expanded the child
    assert forest.node_count(slot) < nodes  # the rest of the old tree is gone from the arrays
    second = forest.search([slot], evaluator, 30, CFG, np.random.default_rng(0))[0]
    assert second.counts.sum() == kept + 30
    assert forest.root_state(slot).to_text() == "4" + GAME.action_to_text(action)
    with pytest.raises(IllegalMoveError):
        forest.advance(slot, 9)
    assert forest.root_state(slot).to_text() == "4" + GAME.action_to_text(action)


def test_slots_are_released_and_reused_and_one_slot_is_searched_once_a_call() -> None:
    forest = SearchForest.for_search(GAME, CFG, trees=1)
    a, b = forest.add(GAME.parse("4")), forest.add(GAME.parse("44"))  # the arrays grow to two trees
    assert forest.slots() == [a, b]
    forest.release(a)
    assert forest.add(GAME.parse("1")) == a and forest.root_state(a).to_text() == "1"
    with pytest.raises(ValueError, match="once a call"):
        forest.search([a, a], UniformEvaluator(GAME), 4, CFG, np.random.default_rng(0))
    forest.release(b)
    with pytest.raises(ValueError, match="not in use"):
        forest.root_state(b)


def test_leaves_of_many_trees_share_one_evaluator_call_per_round() -> None:
    class Recording(UniformEvaluator):
        sizes: list[int] = []

        def evaluate_batch(self, words):
            self.sizes.append(len(words))
            return super().evaluate_batch(words)

    evaluator = Recording(GAME)
    forest = SearchForest(GAME)
    slots = [forest.add(GAME.parse(text)) for text in ["", "4", "44", "443", "4433", "12", "7", "1"]]
    results = forest.search(slots, evaluator, 20, CFG, np.random.default_rng(0))
    assert evaluator.sizes[0] == len(slots)  # roots, together
    assert len(evaluator.sizes) <= 20 + 1
    assert max(evaluator.sizes) == len(slots)
    assert all(r.counts.sum() == 20 for r in results)


def test_virtual_loss_batches_one_tree_and_still_finds_the_win() -> None:
    evaluator = UniformEvaluator(GAME)
    state = pons_positions()[0][0]
    result = search(state, evaluator, 64, CFG, np.random.default_rng(0), leaves_per_round=8)
    assert result.counts.sum() == 64
    assert result.best_action in winning_moves(state)
    assert evaluator.batches < 64


def test_network_evaluator_masks_illegal_moves() -> None:
    torch.manual_seed(0)
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    evaluator = NetworkEvaluator(new_model(arch, seed=0), GAME)
    states = [GAME.parse("444444"), GAME.parse(""), GAME.parse("1111112")]
    priors, values = evaluator.evaluate(states)
    assert priors.shape == (3, 7) and values.shape == (3,)
    assert np.allclose(priors.sum(axis=1), 1.0)
    assert priors[0, 3] == 0 and priors[2, 0] == 0
    assert np.all(np.abs(values) <= 1.0)
    result = search(states[0], evaluator, 16, CFG, np.random.default_rng(0))
    assert result.visits[3] == 0 and result.counts.sum() == 16


def test_choose_action_and_temperature_schedule() -> None:
    rng = np.random.default_rng(0)
    visits = np.array([0.0, 0.1, 0.6, 0.0, 0.3, 0.0, 0.0])
    assert choose_action(visits, 0.0, rng) == 2
    picks = [choose_action(visits, 1.0, rng) for _ in range(3000)]
    assert set(picks) <= {1, 2, 4}
    assert abs(picks.count(2) / 3000 - 0.6) < 0.05
    ties = {choose_action(np.array([0.5, 0, 0, 0, 0, 0, 0.5]), 0.0, rng) for _ in range(50)}
    assert ties == {0, 6}
    assert temperature_for_ply(0, 10) == 1.0 and temperature_for_ply(9, 10) == 1.0
    assert temperature_for_ply(10, 10) == 0.0
    with pytest.raises(ValueError, match="needs at least one visited move"):
        choose_action(np.zeros(7), 1.0, rng)


def test_forced_playouts_visit_every_noisy_move_and_the_target_gives_them_back() -> None:
    """KataGo's forced playouts: with k > 0 and root noise, each root move with noisy prior p
    gets at least about sqrt(k p N) of N visits; the policy target (`visits`) is the counts with
    those visits pruned again: never more than searched, the most visited move untouched, and
    no move left at one visit. Without noise (evaluation) k changes nothing."""
    cfg = SearchConfig(forced_playouts=2.0)
    state = GAME.parse("4453")
    forced_seen = False
    for seed in range(6):
        forest = SearchForest.for_search(GAME, cfg)
        slot = forest.add(state)
        [result] = forest.search([slot], RolloutEvaluator(GAME, 4, np.random.default_rng(seed)), 200, cfg,
                                 np.random.default_rng(seed), add_noise=True)
        prior = forest.noisy_root_prior(slot)
        total = result.counts.sum()
        assert total == 200
        # forced: each move was chosen while below its floor, so it ends at least one short of it
        floors = np.sqrt(2.0 * prior * total)
        assert np.all(result.counts >= np.floor(floors) - 1), (result.counts, floors)
        pruned = forest.pruned_counts(slot, cfg.c_puct)
        assert np.allclose(result.visits, pruned / pruned.sum())
        best = int(np.argmax(result.counts))
        assert np.all(pruned <= result.counts) and pruned[best] == result.counts[best]
        assert not np.any((pruned > 0) & (pruned <= 1.0))
        assert np.isclose(result.visits.sum(), 1.0) and result.best_action == best
        forced_seen |= bool(np.any(pruned < result.counts))
    assert forced_seen, "pruning never took a visit back in six searches"

    quiet = search(state, UniformEvaluator(GAME), 64, cfg, np.random.default_rng(0))
    base = search(state, UniformEvaluator(GAME), 64, CFG, np.random.default_rng(0))
    assert np.array_equal(quiet.counts, base.counts) and np.allclose(quiet.visits, quiet.counts / 64)
    with pytest.raises(ValueError):
        SearchConfig(forced_playouts=-1.0)
