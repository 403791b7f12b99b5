"""GRPO on an exported rollout dataset: the loss against the stored sampling log-probs, the
checks a dataset must pass before a step touches it, and what the run trained on.

The groups were generated earlier, by the weights the engine held then (the parent of this
generation, or an older best). So the ratio in the clipped surrogate is exp(logp_now -
logp_rollout) with the log-probs the engine recorded, which it drew from logits / temperature:
the training logits are divided by the same temperature, or a temperature other than 1 would
bias every ratio. With `kl_coef > 0` the reference policy is a frozen copy of the weights at
the start of the GRPO phase (the parent, or the SFT result in generation 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import nn

from app.lm.samples import Group
from app.lm.train.backend import LossFn, logits_of
from app.lm.data_buffer import DataBuffer
from app.lm.train.grpo import Batch, GRPOConfig, grpo_loss, token_logprobs


def grpo_loss_fn(cfg: GRPOConfig, temperature: float = 1.0, reference: nn.Module | None = None) -> LossFn:
    """The GRPO loss at the sampling temperature, with reference log-probs when KL is on."""
    if cfg.kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")

    def loss_fn(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        if cfg.kl_coef:
            assert reference is not None
            with torch.no_grad():
                ref = token_logprobs(logits_of(reference, batch).float() / temperature, batch.input_ids)
            batch = dataclasses.replace(batch, ref_logprobs=ref)
        return grpo_loss(logits.float() / temperature if temperature != 1.0 else logits, batch, cfg)

    return loss_fn


def dataset_problem(groups: Sequence[Group], vocab_size: int) -> str | None:
    """Why these groups cannot be trained on by a model of `vocab_size` tokens (None: they can)."""
    if not groups:
        return "holds no groups"
    for group in groups:
        if len(group.samples) < 2:
            return f"group {group.prompt_id} has {len(group.samples)} sample(s): GRPO needs a baseline"
        for s in group.samples:
            tokens = [*s.prompt_tokens, *s.response_tokens]
            if not s.prompt_tokens or any(t < 0 or t >= vocab_size for t in tokens):
                return (f"sample {s.prompt_id}#{s.group_index} has token ids outside the model's "
                        f"vocabulary of {vocab_size} (or an empty prompt)")
    return None


def drawn_mean_reward(groups: Sequence[Group], seed: int, steps: int, per_step: int) -> float:
    """Mean sample reward over every group the run's buffer draws in `steps` steps: a pure
    function of the dataset and the seed, so a resumed run reports what an unbroken one would."""
    buffer = DataBuffer(groups, seed)
    rewards = [r for _ in range(steps) for g in buffer.next_batch(per_step) for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0
