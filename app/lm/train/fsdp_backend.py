"""FSDP2 (`fully_shard`) training backend for torchrun: each rank holds a shard of every
parameter, gradient and Adam moment.

Each decoder layer is its own FSDP unit (its parameters are gathered just for its forward
and backward), the root holds the (tied) embeddings. Which modules are decoder layers the
model says itself: transformers' `_no_split_modules` (LlamaDecoderLayer, Qwen2DecoderLayer,
GPT2Block, ...), so any architecture shards the same way, LoRA-wrapped or not. Gradients are reduce-scattered with a
SUM, not FSDP's default mean: each rank's loss is already divided by the global token count,
so the sum over ranks is the gradient of the whole global batch, equal to one rank's.
A rank with fewer micro-batches than its peers runs empty ones (collate's all-masked row),
since every forward and backward is a collective. Clipping uses the norm over all shards.
Synchronous: every future it returns is already done.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from app.lm.lora import merged_weights
from app.lm.train import dcp_io
from app.lm.train.backend import AccumulatingBackend, LossFn, OptimConfig
from app.shared.process_group import DistContext


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The modules of the classes the model names in `_no_split_modules` (a PeftModel's are its
    base model's); none when it names none (then the root is the one FSDP unit)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = set(getattr(inner, "_no_split_modules", None) or ())
    return [m for m in model.modules() if type(m).__name__ in names]


def shard_model(model: nn.Module, mesh: DeviceMesh, reshard_after_forward: bool = True) -> nn.Module:
    """fully_shard every decoder layer, then the root, over `mesh`; reduce gradients by sum.

    The mesh is always given: without one FSDP builds a CUDA mesh whenever a GPU is visible,
    even for ranks that train on the CPU (more ranks than GPUs), and fails in set_device."""
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM: gloo has no PREMUL_SUM
    return model


class FSDPBackend(AccumulatingBackend):
    def __init__(self, model: nn.Module, optim: OptimConfig, loss_fn: LossFn, env: DistContext,
                 reshard_after_forward: bool = True) -> None:
        self.env = env
        self.rank, self.world_size, self.device = env.rank, env.world_size, env.device
        mesh = init_device_mesh(env.device.type, (env.world_size,))
        super().__init__(shard_model(model.to(env.device), mesh, reshard_after_forward), optim, loss_fn)

    def _reduce_stats(self, stats: dict[str, float]) -> dict[str, float]:
        """A step's stats are summed over micro-batches AND ranks."""
        keys = sorted(stats)
        return dict(zip(keys, self.env.all_reduce_floats([stats[k] for k in keys])))

    def get_weights(self) -> dict[str, torch.Tensor]:
        """Whole weights on EVERY rank (each may feed its own generation engine), as a plain
        model of the architecture (LoRA merged). Collective."""
        return merged_weights(self.model, dcp_io.full_state(self.model, None, rank0_only=False)["model"])

    def full_state(self) -> dict[str, Any]:
        """Whole model and optimizer state on rank 0 only (empty elsewhere). Collective."""
        return dcp_io.full_state(self.model, self.optimizer, rank0_only=True)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        dcp_io.load_full_weights(self.model, state)

    def barrier(self) -> None:
        self.env.barrier()
