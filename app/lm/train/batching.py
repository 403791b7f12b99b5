"""From samples to padded micro-batches. Pure functions; the share of a global batch each rank
takes is `app.shared.process_group.rank_share` (the ticket-parallel rollout splits by it too)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from app.lm.train.grpo import Batch

T = TypeVar("T")


@dataclass(frozen=True)
class TrainSequence:
    """One row to train on: the tokens and, per token, whether it is trained and its old log-prob."""

    tokens: list[int]
    loss_mask: list[int]
    old_logprobs: list[float]
    advantage: float = 0.0

    def __post_init__(self) -> None:
        if not (len(self.tokens) == len(self.loss_mask) == len(self.old_logprobs)):
            raise ValueError(f"tokens ({len(self.tokens)}), loss_mask ({len(self.loss_mask)}) and "
                             f"old_logprobs ({len(self.old_logprobs)}) differ in length")

    @property
    def trained_tokens(self) -> int:
        return int(sum(self.loss_mask))


def chunk(items: Sequence[T], size: int, count: int | None = None) -> list[list[T]]:
    """Consecutive chunks of `size`; with `count`, padded with empty chunks to that many (so
    every rank of an FSDP group runs the same number of forward/backward passes)."""
    if size <= 0:
        raise ValueError(f"micro-batch size must be positive, got {size}")
    chunks = [list(items[i:i + size]) for i in range(0, len(items), size)]
    if count is not None:
        if len(chunks) > count:
            raise ValueError(f"{len(items)} items need {len(chunks)} chunks of {size}, more than {count}")
        chunks += [[] for _ in range(count - len(chunks))]
    return chunks


def sequences_from_samples(samples: Sequence[Any], advantages: Sequence[float]) -> list[TrainSequence]:
    """Prompt + response of each sample (an app.lm Sample) as a training row with its advantage."""
    if len(samples) != len(advantages):
        raise ValueError(f"{len(samples)} samples but {len(advantages)} advantages")
    rows = []
    for sample, adv in zip(samples, advantages):
        prompt = list(sample.prompt_tokens)
        rows.append(TrainSequence(
            tokens=prompt + list(sample.response_tokens),
            loss_mask=[0] * len(prompt) + [int(m) for m in sample.loss_mask],
            old_logprobs=[0.0] * len(prompt) + [float(x) for x in sample.rollout_logprobs],
            advantage=float(adv)))
    return rows


def sft_sequence(prompt_tokens: Sequence[int], completion_tokens: Sequence[int]) -> TrainSequence:
    """A demonstration: trained on the completion only (which should end with EOS)."""
    prompt, completion = list(prompt_tokens), list(completion_tokens)
    return TrainSequence(prompt + completion, [0] * len(prompt) + [1] * len(completion),
                         [0.0] * (len(prompt) + len(completion)))


def collate(rows: Sequence[TrainSequence], pad_id: int, normalizer: float, with_rl: bool = True) -> Batch:
    """Right-padded tensors of `rows`. Right padding keeps positions 0..n-1 without position ids.

    An empty `rows` gives a one-token all-masked batch: a rank with nothing left in this step
    still runs forward/backward so the collectives of its group stay matched; its loss is 0.
    """
    if normalizer <= 0:
        raise ValueError(f"normalizer must be positive (the global batch has trained tokens), got {normalizer}")
    real = len(rows)
    if not rows:
        rows = [TrainSequence([pad_id, pad_id], [0, 0], [0.0, 0.0])]
    width = max(len(r.tokens) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.float32)
    old = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        n = len(row.tokens)
        ids[i, :n] = torch.tensor(row.tokens, dtype=torch.long)
        attn[i, :n] = 1
        mask[i, :n] = torch.tensor(row.loss_mask, dtype=torch.float32)
        old[i, :n] = torch.tensor(row.old_logprobs, dtype=torch.float32)
    if not with_rl:
        return Batch(ids, attn, mask, float(normalizer), meta={"rows": real})
    adv = torch.tensor([r.advantage for r in rows], dtype=torch.float32)
    return Batch(ids, attn, mask, float(normalizer), advantages=adv, old_logprobs=old, meta={"rows": real})
