"""What one training step optimises, behind a small interface another workload can replace.

The trainer knows only `TrainTask`: tensors of a batch in, a scalar loss and a few named
metric values out. The AlphaZero policy/value loss is one implementation.
"""

from __future__ import annotations

from typing import Protocol, Sequence

import torch
from torch import nn


class TrainTask(Protocol):
    metric_names: Sequence[str]  # what `loss` returns beside the loss, in order

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(scalar loss to minimise, 1-D tensor of metric values, detached), means over the batch."""
        ...


class PolicyValueTask:
    """Cross-entropy of the policy against the MCTS visit distribution plus the value's MSE
    against the game outcome. Weight decay lives in the optimizer (AdamW), not here."""

    metric_names = ("loss", "policy_loss", "value_loss")

    def __init__(self, value_weight: float = 1.0) -> None:
        self.value_weight = value_weight

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        logits, value = model(batch["planes"])
        policy_loss = -(batch["policy"] * torch.log_softmax(logits, dim=-1)).sum(dim=-1).mean()
        value_loss = torch.mean((value - batch["value"]) ** 2)
        loss = policy_loss + self.value_weight * value_loss
        return loss, torch.stack([loss, policy_loss, value_loss]).detach()


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: Sequence[torch.Tensor]) -> None:
    """Recompute BatchNorm running statistics as the plain average over `batches` ("precise BN").

    Running statistics gathered during DDP training depend on how batches were split over
    ranks; recomputing them from fixed data before every evaluation and before saving makes
    holdout losses and the candidate independent of the number of processes.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms or not batches:
        return
    saved = [(m, m.momentum) for m in norms]
    was_training = model.training
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # cumulative average over the calls below
    model.train()
    try:
        for planes in batches:
            model(planes)
    finally:
        for m, momentum in saved:
            m.momentum = momentum
        model.train(was_training)
