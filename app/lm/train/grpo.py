"""GRPO and SFT losses over one micro-batch: pure tensor functions, no I/O, no process group.

Conventions that keep the losses honest (they are the usual mistakes):
- Token log-probs use the next-token shift: the log-prob of token t comes from the logits at
  position t-1. `token_logprobs` returns them aligned with the tokens (column 0 is 0), so a
  per-token mask, the rollout log-probs and the reference log-probs all share one index.
- Only response tokens the model generated count: the loss mask is 0 on the prompt, on
  padding and on tool/environment tokens spliced into a multi-turn trace.
- The loss is a SUM over masked tokens divided by `batch.normalizer`, the number of response
  tokens of the whole global batch (all micro-batches, all ranks). So every token weighs the
  same whatever its sequence's length, and the gradients summed over micro-batches and ranks
  equal those of the whole batch in one piece, at any world size.
- Advantages are normalised within a prompt's group: (r - mean) / (std + eps), std optional.
- The rollout log-probs were drawn from logits / temperature, so the trainer's are too, and
  so are the reference policy's: `policy_logprobs` is the one place the temperature enters,
  and `grpo_loss_fn` (what the online and the offline run both train with) the one caller
  that passes it. At any other temperature than the sampler's the ratio would be biased from
  the first step.
- Behaviour correction (`tis_cap` > 0, the online loop's default): the groups were sampled by
  an engine that may hold older weights than the trainer's (up to `max_staleness` versions) and
  computes log-probs its own way. As verl's and slime's truncated importance sampling (TIS) and
  AReaL's decoupled objective, the clipped ratio is then taken against the trainer's own
  log-probs before this update (the proximal policy: one optimizer step per batch, so these
  are the forward's own values, detached) and every token is weighted by
  min(pi_trainer / pi_behaviour, tis_cap), the behaviour log-probs being the engine's.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class Batch:
    """One micro-batch of sequences (prompt + response), right-padded to one length T.

    `loss_mask[b, t]` is 1 where token t of row b is trained on. `old_logprobs[b, t]` is the
    log-prob of token t under the policy that sampled it (GRPO only), `ref_logprobs` under the
    reference model (KL term only). `normalizer` is the global batch's response-token count.
    """

    input_ids: torch.Tensor  # [B, T] long
    attention_mask: torch.Tensor  # [B, T] long
    loss_mask: torch.Tensor  # [B, T] float
    normalizer: float
    advantages: torch.Tensor | None = None  # [B] float
    old_logprobs: torch.Tensor | None = None  # [B, T] float
    ref_logprobs: torch.Tensor | None = None  # [B, T] float
    meta: dict = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def tokens(self) -> float:
        return float(self.loss_mask.sum().item())

    def to(self, device: torch.device) -> Batch:
        move = lambda t: None if t is None else t.to(device)
        return Batch(self.input_ids.to(device), self.attention_mask.to(device), self.loss_mask.to(device),
                     self.normalizer, move(self.advantages), move(self.old_logprobs), move(self.ref_logprobs),
                     self.meta)


@dataclass(frozen=True)
class GRPOConfig:
    clip_low: float = 0.2  # ratio floor 1 - clip_low
    clip_high: float = 0.2  # ratio ceiling 1 + clip_high (DAPO's "clip higher" when larger)
    kl_coef: float = 0.0  # weight of the k3 KL estimate to the reference policy; 0 = no reference needed
    tis_cap: float = 0.0  # > 0: truncated importance weight pi_trainer / pi_behaviour, capped here; 0: off


def group_advantages(rewards: Sequence[float], scale_by_std: bool = True, eps: float = 1e-6) -> list[float]:
    """(r - mean) / (std + eps) within one prompt's group; a group of equal rewards gives zeros.

    The population std (ddof 0), as in the GRPO paper's implementations. `scale_by_std=False`
    keeps only the mean baseline (Dr. GRPO), which avoids over-weighting near-uniform groups.
    """
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    centred = [float(r) - mean for r in rewards]
    if not scale_by_std:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / len(centred))
    return [c / (std + eps) for c in centred]


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t >= 1, aligned with `input_ids` ([B, T]; column 0 is 0)."""
    shifted = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = shifted.gather(-1, input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    return F.pad(picked, (1, 0), value=0.0)


def policy_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """`token_logprobs` under the sampling distribution softmax(logits / temperature)."""
    if temperature <= 0:
        raise ValueError(f"temperature {temperature} must be > 0: greedy decoding has no log-probs to train on")
    return token_logprobs(logits.float() / temperature if temperature != 1.0 else logits, input_ids)


def sft_loss(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
    """Token cross-entropy over the masked tokens, summed and divided by the global count."""
    mask = batch.loss_mask.float()
    nll = -token_logprobs(logits, batch.input_ids) * mask
    loss = nll.sum() / batch.normalizer
    return loss, {"nll_sum": float(nll.sum().detach())}


def grpo_loss(logits: torch.Tensor, batch: Batch, cfg: GRPOConfig,
              temperature: float = 1.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Token-level clipped surrogate against the sampling policy's log-probs, plus k3 KL.

    per token: -min(ratio * A, clip(ratio, 1 - clip_low, 1 + clip_high) * A), ratio =
    exp(logp - logp_rollout), A the sequence's group-normalised advantage, logp at the
    sampling `temperature`. With `cfg.tis_cap` > 0 the ratio is against the trainer's own
    detached log-probs and the term is weighted by min(exp(logp - logp_rollout), tis_cap),
    detached (the module docstring). Metrics are sums over the micro-batch so the caller can
    add them across micro-batches and ranks; `ratio_sum` is always of pi_trainer / pi_behaviour.
    """
    if batch.advantages is None or batch.old_logprobs is None:
        raise ValueError("a GRPO batch needs advantages and old_logprobs")
    mask = batch.loss_mask.float()
    logp = policy_logprobs(logits, batch.input_ids, temperature)
    behaviour_ratio = torch.exp((logp.detach() - batch.old_logprobs.float()) * mask)
    if cfg.tis_cap > 0:
        ratio = torch.exp((logp - logp.detach()) * mask)  # 1 in value; its gradient is the policy gradient's
        weight = torch.clamp(behaviour_ratio, max=cfg.tis_cap)
    else:
        ratio = torch.exp((logp - batch.old_logprobs.float()) * mask)
        weight = None
    adv = batch.advantages.float().unsqueeze(-1)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    metrics: dict[str, float] = {}
    if weight is not None:
        per_token = per_token * weight
        metrics["tis_truncated_tokens"] = float(((behaviour_ratio > cfg.tis_cap).float() * mask).sum())
        metrics["tis_weight_sum"] = float((weight * mask).sum())
    if cfg.kl_coef:
        if batch.ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch")
        delta = (batch.ref_logprobs.float() - logp) * mask
        kl = torch.exp(delta) - delta - 1.0  # k3: unbiased, always >= 0
        per_token = per_token + cfg.kl_coef * kl
        metrics["kl_sum"] = float((kl * mask).sum().detach())
    loss = (per_token * mask).sum() / batch.normalizer
    with torch.no_grad():
        was_clipped = (clipped < unclipped).float() * mask  # where the clip bound wins the min
        metrics["clipped_tokens"] = float(was_clipped.sum())
        metrics["ratio_sum"] = float((behaviour_ratio * mask).sum())
    return loss, metrics


def grpo_loss_fn(cfg: GRPOConfig, temperature: float = 1.0, reference: nn.Module | None = None,
                 ) -> Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, float]]]:
    """The GRPO loss at the sampling temperature, with the reference policy's log-probs (at
    the same temperature) when KL is on: what both the online and the offline run train with."""
    if cfg.kl_coef and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    policy_logprobs(torch.zeros(1, 1, 1), torch.zeros(1, 1, dtype=torch.long), temperature)  # refuse T <= 0 now

    def loss_fn(logits: torch.Tensor, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        if cfg.kl_coef:
            assert reference is not None
            with torch.no_grad():
                ref_logits = reference(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                                       use_cache=False).logits
                ref = policy_logprobs(ref_logits, batch.input_ids, temperature)
            batch = dataclasses.replace(batch, ref_logprobs=ref)
        return grpo_loss(logits, batch, cfg, temperature)

    return loss_fn
