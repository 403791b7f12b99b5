"""The LM promotion gate (pure, hypothesis) and the greedy held-out evaluation that feeds it
(real models and the in-process engine)."""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config.lm import LMConfig
from app.lm.workload.heldout import evaluate_pair
from app.lm.workload.gate import paired_gate, reward_interval, sign_test_p
from app.lm.rollout.engine_config import build_engine
from app.lm.setup import (
    build_task, build_tokenizer, greedy_settings, heldout_prompts, initial_model, train_prompts,
)

pytestmark = pytest.mark.timeout(240)
torch.set_num_threads(1)

rewards01 = st.lists(st.sampled_from([0.0, 1.0]), min_size=1, max_size=40)
partial = st.lists(st.floats(min_value=0.0, max_value=1.0, allow_nan=False), min_size=1, max_size=40)
methods = st.sampled_from(["sign", "bootstrap"])
confidences = st.sampled_from([0.8, 0.9, 0.95, 0.99])


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 7), st.integers(0, 7))
def test_the_sign_test_is_the_exact_binomial_tail(wins: int, losses: int) -> None:
    m = wins + losses
    outcomes = list(product((0, 1), repeat=m))
    brute = sum(sum(o) >= wins for o in outcomes) / len(outcomes)
    assert math.isclose(sign_test_p(wins, losses), brute, abs_tol=1e-12)


@settings(max_examples=200, deadline=None)
@given(partial, methods, confidences)
def test_a_model_never_beats_itself(rewards: list[float], method: str, confidence: float) -> None:
    result = paired_gate(rewards, rewards, method=method, confidence=confidence, bootstrap_samples=200)
    assert not result.promote and result.wins == result.losses == 0 and result.ties == len(rewards)


@settings(max_examples=200, deadline=None)
@given(st.data(), methods, confidences)
def test_the_gate_never_promotes_both_ways_nor_a_candidate_no_better_anywhere(data, method, confidence) -> None:
    best = data.draw(partial)
    cand = data.draw(st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=len(best), max_size=len(best)))
    kw = {"method": method, "confidence": confidence, "bootstrap_samples": 300}
    assert not (paired_gate(cand, best, **kw).promote and paired_gate(best, cand, **kw).promote)
    worse = [min(c, b) for c, b in zip(cand, best)]
    assert not paired_gate(worse, best, **kw).promote


@settings(max_examples=100, deadline=None)
@given(rewards01, rewards01, st.integers(0, 20))
def test_ties_carry_no_weight_in_the_sign_test(cand: list[float], best: list[float], ties: int) -> None:
    n = min(len(cand), len(best))
    cand, best = cand[:n], best[:n]
    plain = paired_gate(cand, best, bootstrap_samples=100)
    padded = paired_gate(cand + [1.0] * ties, best + [1.0] * ties, bootstrap_samples=100)
    assert plain.p_value == padded.p_value and plain.wins == padded.wins and padded.ties == plain.ties + ties


@pytest.mark.parametrize("confidence", [0.8, 0.9, 0.95, 0.99])
def test_a_candidate_no_better_than_the_best_is_promoted_at_most_one_minus_confidence_of_the_time(confidence) -> None:
    """Under H0 (each differing prompt a fair coin) the chance of promotion, computed exactly
    over every outcome, never exceeds 1 - confidence, whatever the number of differing prompts."""
    for m in range(1, 41):
        size = sum(math.comb(m, w) for w in range(m + 1)
                   if paired_gate([1.0] * w + [0.0] * (m - w), [0.0] * w + [1.0] * (m - w),
                                  confidence=confidence, bootstrap_samples=100).promote) / 2**m
        assert size <= 1 - confidence + 1e-12, (m, size)


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 30), st.integers(0, 30), methods)
def test_turning_a_loss_into_a_win_never_takes_a_promotion_away(wins: int, losses: int, method: str) -> None:
    def gate(w: int, lo: int) -> bool:
        return paired_gate([1.0] * w + [0.0] * lo + [0.5] * 3, [0.0] * w + [1.0] * lo + [0.5] * 3,
                           method=method, bootstrap_samples=500).promote
    if losses:
        assert gate(wins + 1, losses - 1) >= gate(wins, losses)


def test_clear_gains_promote_and_the_result_says_why() -> None:
    best = [0.0] * 30 + [1.0] * 10
    cand = [1.0] * 25 + [0.0] * 5 + [1.0] * 10
    for method in ("sign", "bootstrap"):
        result = paired_gate(cand, best, method=method)
        assert result.promote and result.wins == 25 and result.losses == 0 and result.ties == 15
        assert result.interval[0] > 0 and "better" in result.reason
        assert paired_gate(cand, best, method=method, min_improvement=0.7).promote is False
    # many tiny wins, a few large losses: the signs say better, the mean says worse
    cand = [0.6] * 20 + [0.0] * 4
    best = [0.5] * 20 + [1.0] * 4
    result = paired_gate(cand, best)
    assert result.p_value < 0.05 and not result.promote and "min_improvement" in result.reason
    with pytest.raises(ValueError, match="align"):
        paired_gate([1.0], [1.0, 0.0])
    assert paired_gate([], []).promote is False


@settings(max_examples=100, deadline=None)
@given(partial)
def test_the_reward_interval_holds_the_mean_and_stays_in_range(rewards: list[float]) -> None:
    mean, low, high = reward_interval(rewards)
    assert 0.0 <= low <= mean + 1e-12 and mean - 1e-12 <= high <= 1.0
    _, low4, high4 = reward_interval(rewards * 4)
    assert high4 - low4 <= high - low + 1e-12  # more prompts, a narrower interval


# -- the greedy held-out evaluation, with real models ---------------------------------------------
def sft_copy_model(cfg, tok, task, steps: int):  # type: ignore[no-untyped-def]
    """A model taught to copy by teacher forcing on the task's demonstrations (the candidate)."""
    model = initial_model(cfg.model, tok)
    pool = train_prompts(task, cfg.task)
    rows = torch.tensor([tok(p.text)["input_ids"] + tok(task.demonstration(p), add_special_tokens=False)["input_ids"]
                         + [tok.eos_token_id] for p in pool])
    plen = len(tok(pool[0].text)["input_ids"])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(steps):
        batch = rows[torch.randint(0, len(rows), (32,), generator=gen)]
        logits = model(input_ids=batch).logits[:, plen - 1:-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, plen:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval()


def test_a_trained_candidate_passes_the_gate_against_random_init_and_not_the_other_way() -> None:
    cfg = LMConfig.model_validate({
        "model": {"hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "max_position": 32},
        "task": {"name": "copy", "reward_kind": "partial", "train_prompts": 256, "heldout_prompts": 24},
        "rollout": {"n": 2, "max_new_tokens": 5, "max_seq_len": 24}})
    tok, task = build_tokenizer(cfg.tokenizer), build_task(cfg.task)
    held = heldout_prompts(task, cfg.task)
    assert held == heldout_prompts(task, cfg.task)  # every node and generation: the same prompts
    best = build_engine(cfg.engines[0], initial_model(cfg.model, tok), tok, weight_version=0)
    cand = build_engine(cfg.engines[0], sft_copy_model(cfg, tok, task, 150), tok, weight_version=1)
    settings = greedy_settings(cfg)
    result = evaluate_pair(cand, best, task, tok, held, settings)
    assert result.candidate.prompt_ids == [p.prompt_id for p in held] == result.best.prompt_ids
    assert result.gate.promote and result.gate.wins > result.gate.losses, result.gate
    summary = result.to_json()
    assert summary["candidate"]["weight_version"] == 1 and summary["best"]["exact_match"] < 0.15
    assert summary["candidate"]["exact_match"] > summary["best"]["exact_match"]
    low, high = summary["candidate"]["interval"]
    assert low <= summary["candidate"]["reward"] <= high
    assert not evaluate_pair(best, cand, task, tok, held, settings).gate.promote
    again = evaluate_pair(cand, cand, task, tok, held, settings)  # greedy: the same answers twice
    assert again.candidate.rewards == again.best.rewards == result.candidate.rewards and not again.gate.promote
