"""GRPO loss and advantages, the DataBuffer's order, and micro-batch collation (pure, fast)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from app.lm.train.batching import TrainSequence, chunk, collate
from app.lm.data_buffer import DataBuffer
from app.lm.train.grpo import (
    Batch,
    GRPOConfig,
    group_advantages,
    grpo_loss,
    sft_loss,
    token_logprobs,
)


def test_group_advantages_normalise_within_the_group():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert adv == pytest.approx([1.0, -1.0, -1.0, 1.0], abs=1e-5)
    assert group_advantages([0.5, 0.5, 0.5]) == [0.0, 0.0, 0.0]
    assert group_advantages([1.0, 0.0], scale_by_std=False) == [0.5, -0.5]
    assert group_advantages([]) == []


def test_token_logprobs_use_the_next_token_shift():
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    lp = token_logprobs(logits, ids)
    assert lp.shape == (2, 5) and torch.all(lp[:, 0] == 0)
    expected = torch.log_softmax(logits[1, 2], -1)[ids[1, 3]]
    assert lp[1, 3] == pytest.approx(float(expected), abs=1e-6)


def batch_of(ids, mask, adv, old, normalizer=None) -> Batch:
    ids = torch.tensor(ids)
    mask_t = torch.tensor(mask, dtype=torch.float32)
    return Batch(ids, torch.ones_like(ids), mask_t, normalizer or float(mask_t.sum()),
                 advantages=torch.tensor(adv, dtype=torch.float32), old_logprobs=torch.tensor(old, dtype=torch.float32))


def test_loss_covers_masked_response_tokens_only():
    torch.manual_seed(0)
    logits = torch.randn(1, 6, 5, requires_grad=True)
    b = batch_of([[1, 2, 3, 4, 0, 1]], [[0, 0, 0, 1, 1, 0]], [1.0], [[0.0] * 6])
    loss, _ = grpo_loss(logits, b, GRPOConfig())
    loss.backward()
    # only logits at positions 2 and 3 predict the masked tokens 3 and 4
    touched = logits.grad.abs().sum(-1)[0]
    assert torch.all(touched[[0, 1, 4, 5]] == 0) and torch.all(touched[[2, 3]] > 0)


def test_ppo_clip_stops_the_gradient_beyond_the_trust_region():
    logits = torch.zeros(1, 2, 4, requires_grad=True)  # logp of any token = log(1/4)
    lp = math.log(0.25)
    for old, adv, expect_grad in ((lp - 1.0, 1.0, False), (lp - 1.0, -1.0, True), (lp, 1.0, True)):
        logits.grad = None
        b = batch_of([[0, 1]], [[0, 1]], [adv], [[0.0, old]])
        loss, metrics = grpo_loss(logits, b, GRPOConfig(clip_low=0.2, clip_high=0.2))
        loss.backward()
        assert (logits.grad.abs().sum() > 0) == expect_grad, (old, adv)
        if not expect_grad:
            assert metrics["clipped_tokens"] == 1.0
            assert float(loss.detach()) == pytest.approx(-1.2)  # clipped ratio 1.2 times advantage 1


def test_normalised_by_token_count_not_per_sequence():
    """A long and a short sequence with the same advantage: each token weighs the same."""
    logits = torch.zeros(2, 5, 4, requires_grad=True)
    b = batch_of([[0, 1, 1, 1, 1], [0, 1, 0, 0, 0]], [[0, 1, 1, 1, 1], [0, 1, 0, 0, 0]], [1.0, 1.0],
                 [[0.0] + [math.log(0.25)] * 4, [0.0, math.log(0.25), 0, 0, 0]])
    loss, _ = grpo_loss(logits, b, GRPOConfig())
    loss.backward()
    per_token = logits.grad.abs().sum(-1)
    assert b.normalizer == 5.0
    assert per_token[0, 0] == pytest.approx(float(per_token[1, 0]))  # same weight per token
    assert float(loss.detach()) == pytest.approx(-1.0)


def test_kl_term_is_zero_at_the_reference_and_positive_away_from_it():
    logits = torch.randn(1, 4, 6)
    ids = torch.tensor([[1, 2, 3, 4]])
    lp = token_logprobs(logits, ids)
    b = batch_of([[1, 2, 3, 4]], [[0, 1, 1, 1]], [0.0], lp.tolist())
    b.ref_logprobs = lp.clone()
    _, m = grpo_loss(logits, b, GRPOConfig(kl_coef=0.1))
    assert m["kl_sum"] == pytest.approx(0.0, abs=1e-6)
    b.ref_logprobs = lp - 0.5
    loss, m = grpo_loss(logits, b, GRPOConfig(kl_coef=0.1))
    assert m["kl_sum"] > 0 and float(loss) > 0
    with pytest.raises(ValueError, match="ref_logprobs"):
        b.ref_logprobs = None
        grpo_loss(logits, b, GRPOConfig(kl_coef=0.1))


def test_sft_loss_is_mean_token_nll_over_the_global_count():
    logits = torch.zeros(1, 3, 4)
    b = Batch(torch.tensor([[0, 1, 2]]), torch.ones(1, 3, dtype=torch.long), torch.tensor([[0.0, 1.0, 1.0]]), 4.0)
    loss, _ = sft_loss(logits, b)
    assert float(loss) == pytest.approx(2 * math.log(4) / 4)


def test_collate_right_pads_and_an_empty_share_gives_a_zero_loss_row():
    rows = [TrainSequence([1, 5, 6], [0, 1, 1], [0.0, -1.0, -2.0], 0.5), TrainSequence([1, 7], [0, 1], [0.0, -1.0], -0.5)]
    b = collate(rows, pad_id=0, normalizer=3)
    assert b.input_ids.tolist() == [[1, 5, 6], [1, 7, 0]] and b.attention_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    assert b.loss_mask.tolist() == [[0, 1, 1], [0, 1, 0]] and b.advantages.tolist() == [0.5, -0.5]
    empty = collate([], pad_id=0, normalizer=3)
    assert empty.tokens == 0 and empty.meta["rows"] == 0
    assert chunk([1, 2, 3], 2, count=3) == [[1, 2], [3], []]
    with pytest.raises(ValueError):
        TrainSequence([1, 2], [0], [0.0, 0.0])


@given(size=st.integers(1, 30), seed=st.integers(0, 10**6), cut=st.integers(0, 100), batch=st.integers(1, 13))
def test_data_buffer_resume_equals_the_uninterrupted_order(size, seed, cut, batch):
    items = [f"p{i}" for i in range(size)]
    original = list(items)
    whole = DataBuffer(items, seed)
    expected = [whole.next_batch(batch) for _ in range(8)]
    first = DataBuffer(items, seed)
    got = []
    for k in range(8):
        if k == cut % 8:
            state = first.state_dict()
            first = DataBuffer(items, seed)
            first.load_state_dict(state)
        got.append(first.next_batch(batch))
    assert got == expected
    assert items == original  # the caller's list is never shuffled in place


def test_data_buffer_epochs_are_permutations_from_seed_plus_epoch():
    import random

    buf = DataBuffer(list(range(10)), seed=7)
    epoch0, epoch1 = buf.next_batch(10), buf.next_batch(10)
    for epoch, got in ((0, epoch0), (1, epoch1)):
        order = list(range(10))
        random.Random(7 + epoch).shuffle(order)
        assert got == order
    with pytest.raises(ValueError, match="seed"):
        DataBuffer(list(range(10)), seed=8).load_state_dict(buf.state_dict())
    with pytest.raises(ValueError, match="items"):
        DataBuffer(list(range(9)), seed=7).load_state_dict(buf.state_dict())


def test_tis_weights_each_token_by_the_capped_trainer_over_behaviour_ratio():
    """The behaviour correction: the gradient is the on-policy one times min(pi / pi_behaviour,
    cap) per token; on-policy (behaviour = trainer) it is exactly the uncorrected loss's."""
    torch.manual_seed(0)
    ids, mask, adv = [[1, 2, 3, 4]], [[0, 1, 1, 1]], [1.5]
    logits = torch.randn(1, 4, 5)
    own = token_logprobs(logits, torch.tensor(ids))
    cfg = GRPOConfig(tis_cap=2.0)

    def grad_of(cfg: GRPOConfig, old: torch.Tensor) -> tuple[torch.Tensor, dict]:
        x = logits.clone().requires_grad_(True)
        loss, metrics = grpo_loss(x, batch_of(ids, mask, adv, old.tolist()), cfg)
        loss.backward()
        return x.grad, metrics

    on_policy, metrics = grad_of(cfg, own)
    plain, _ = grad_of(GRPOConfig(), own)
    torch.testing.assert_close(on_policy, plain)
    assert metrics["tis_truncated_tokens"] == 0 and metrics["tis_weight_sum"] == pytest.approx(3.0)
    # the engine gave token 1 a tenth of the trainer's probability (weight 10, capped at 2),
    # token 2 two thirds of it (weight 1.5) and token 3 ten times it (weight 0.1)
    shift = torch.tensor([[0.0, -math.log(10.0), -math.log(1.5), math.log(10.0)]])
    stale, metrics = grad_of(cfg, own + shift)
    weights = [0.0, 2.0, 1.5, 0.1]
    for t in (1, 2, 3):  # the logits at t - 1 predict token t
        torch.testing.assert_close(stale[0, t - 1], weights[t] * plain[0, t - 1])
    assert metrics["tis_truncated_tokens"] == 1.0  # token 1's
    assert metrics["ratio_sum"] == pytest.approx(10.0 + 1.5 + 0.1, rel=1e-5)  # trainer over behaviour, uncapped

