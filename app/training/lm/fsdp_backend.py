"""FSDP2 (`fully_shard`) training backend for torchrun: each rank holds a shard of every
parameter, gradient and Adam moment.

Each decoder layer is its own FSDP unit (its parameters are gathered just for its forward
and backward), the root holds the (tied) embeddings. Gradients are reduce-scattered with a
SUM, not FSDP's default mean: each rank's loss is already divided by the global token count,
so the sum over ranks is the gradient of the whole global batch, equal to one rank's.
A rank with fewer micro-batches than its peers runs empty ones (collate's all-masked row),
since every forward and backward is a collective. Clipping uses the norm over all shards.
Synchronous: every future it returns is already done.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from app.training.lm import dcp_io
from app.training.lm.backend import (
    LossFn,
    OptimConfig,
    add_into,
    done,
    grad_norm_and_clip,
    make_optimizer,
    run_micro_batch,
)
from app.training.lm.dist_env import DistEnv
from app.training.lm.grpo import Batch


def shard_model(model: nn.Module, reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard every decoder layer, then the root; reduce gradients by sum."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    for layer in layers or []:
        fully_shard(layer, reshard_after_forward=reshard_after_forward)
    fully_shard(model, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


class FSDPBackend:
    def __init__(self, model: nn.Module, optim: OptimConfig, loss_fn: LossFn, env: DistEnv,
                 reshard_after_forward: bool = True) -> None:
        self.env = env
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        self.model = shard_model(model.to(env.device), reshard_after_forward)
        self.model.train()
        self.optim_cfg = optim
        self.optimizer = make_optimizer(self.model, optim)
        self.loss_fn = loss_fn
        self._pending: dict[str, float] = {}

    def forward_backward(self, batch: Batch, loss_fn: LossFn | None = None) -> Future[dict[str, float]]:
        stats = run_micro_batch(self.model, batch.to(self.device), loss_fn or self.loss_fn)
        add_into(self._pending, stats)
        return done(stats)

    def optim_step(self) -> Future[dict[str, float]]:
        """Step on the accumulated gradients; the stats are summed over micro-batches AND ranks."""
        norm = grad_norm_and_clip(self.model, self.optim_cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        keys = sorted(self._pending)
        summed = dict(zip(keys, self.env.all_reduce_sum([self._pending[k] for k in keys])))
        self._pending = {}
        return done({**summed, "grad_norm": norm})

    def save_checkpoint(self, directory: str | Path) -> None:
        dcp_io.save_sharded(self.model, self.optimizer, Path(directory))

    def load_checkpoint(self, directory: str | Path) -> None:
        dcp_io.load_sharded(self.model, self.optimizer, Path(directory))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Whole weights on EVERY rank (each may feed its own generation engine). Collective."""
        return dcp_io.full_state(self.model, None, rank0_only=False)["model"]

    def full_state(self) -> dict[str, Any]:
        """Whole model and optimizer state on rank 0 only (empty elsewhere). Collective."""
        return dcp_io.full_state(self.model, self.optimizer, rank0_only=True)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        dcp_io.load_full_weights(self.model, state)

    def barrier(self) -> None:
        self.env.barrier()
