"""Training backends for language models: one protocol, two implementations, no inheritance.

    fut = backend.forward_backward(batch)   # adds this micro-batch's gradients
    ...                                      # more micro-batches: gradients accumulate
    stats = wait(backend.optim_step())      # clip by the global norm, step, zero the gradients

Every call that may run asynchronously returns a `concurrent.futures.Future`; a backend that
works synchronously returns one already done, so callers await both kinds the same way
(`wait`). Nothing inside `forward_backward` zeroes gradients: only `optim_step` does, after
stepping. The loss of a micro-batch is a sum over its tokens divided by the GLOBAL batch's
token count (`Batch.normalizer`), so summing gradients over micro-batches (and, in the FSDP
backend, over ranks) gives the gradient of the whole batch, the same at any world size.

Every forward runs in eval mode (dropout off, gradients on: `without_dropout`), in both
backends: log-probs for the GRPO ratio must come from the same function the engine sampled.

`LocalBackend` is one process (CPU or one GPU). `FSDPBackend` (fsdp_backend.py) shards the
model with FSDP2 under torchrun. Both save and load DCP checkpoints (lm/dcp_io.py), so a
checkpoint of one resumes in the other and at another world size.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch import nn

from app.lm.train import dcp_io
from app.lm.train.grpo import Batch
from app.lm.lora import merged_weights

T = TypeVar("T")
LossFn = Callable[[torch.Tensor, Batch], tuple[torch.Tensor, dict[str, float]]]


def done(value: T) -> Future[T]:
    """An already-completed future: how synchronous work answers the asynchronous protocol."""
    fut: Future[T] = Future()
    fut.set_result(value)
    return fut


def wait(fut: Future[T], timeout: float | None = None) -> T:
    """The one way to await a backend's result (re-raises the backend's exception)."""
    return fut.result(timeout=timeout)


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    eps: float = 1e-8
    max_grad_norm: float | None = 1.0  # None: no clipping (the norm is still reported)


@runtime_checkable
class TrainingBackend(Protocol):
    rank: int
    world_size: int
    device: torch.device
    model: nn.Module

    def forward_backward(self, batch: Batch, loss_fn: LossFn | None = None) -> Future[dict[str, float]]: ...
    def optim_step(self) -> Future[dict[str, float]]: ...
    def save_checkpoint(self, directory: str | Path) -> None: ...
    def load_checkpoint(self, directory: str | Path) -> None: ...
    def get_weights(self) -> dict[str, torch.Tensor]: ...
    def load_weights(self, state: dict[str, torch.Tensor]) -> None: ...
    def barrier(self) -> None: ...


def make_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over the parameters that train (all of them, or LoRA's adapters alone)."""
    # foreach=False: the per-parameter loop gives the same arithmetic on a whole tensor and on
    # its FSDP shards, so runs at different world sizes stay equal to rounding.
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                             weight_decay=cfg.weight_decay, foreach=False)


def logits_of(model: nn.Module, batch: Batch) -> torch.Tensor:
    return model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits


def without_dropout(model: nn.Module) -> nn.Module:
    """Eval mode with gradients still on: the trainer's forward is then the sampler's (engines
    generate in eval mode), so the importance ratio of an on-policy token is exactly 1. With
    dropout on (GPT-2 ships 0.1) the ratio at learning rate 0 averages 0.994, single tokens
    are off by 2 nats and 3-4 % are clipped from the first step; TRL turns dropout off for RL
    the same way. Applied before every forward, so a caller that set train mode cannot undo it."""
    if model.training:
        model.eval()
    return model


def run_micro_batch(model: nn.Module, batch: Batch, loss_fn: LossFn) -> dict[str, float]:
    """Forward (dropout off), loss, backward (gradients add to what is there); the sums this
    micro-batch adds."""
    logits = logits_of(without_dropout(model), batch)
    loss, metrics = loss_fn(logits, batch)
    loss.backward()
    return {"loss": float(loss.detach()), "tokens": batch.tokens, "rows": float(batch.meta.get("rows", batch.rows)),
            **metrics}


def add_into(total: dict[str, float], part: dict[str, float]) -> None:
    for key, value in part.items():
        total[key] = total.get(key, 0.0) + float(value)


def grad_norm_and_clip(model: nn.Module, max_norm: float | None) -> float:
    """The global L2 norm of all gradients (over every shard when parameters are DTensors)."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return 0.0
    limit = max_norm if max_norm is not None else float("inf")
    norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=False)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


class AccumulatingBackend:
    """What the backends share: micro-batches accumulate gradients and stats, a step clips,
    steps and reports them (`_reduce_stats`: as they are on one process, summed over the ranks
    of a sharded model), checkpoints are DCP directories."""

    def __init__(self, model: nn.Module, optim: OptimConfig, loss_fn: LossFn) -> None:
        self.model = without_dropout(model)
        self.optim_cfg = optim
        self.optimizer = make_optimizer(self.model, optim)
        self.loss_fn = loss_fn
        self._pending: dict[str, float] = {}

    def forward_backward(self, batch: Batch, loss_fn: LossFn | None = None) -> Future[dict[str, float]]:
        stats = run_micro_batch(self.model, batch.to(self.device), loss_fn or self.loss_fn)
        add_into(self._pending, stats)
        return done(stats)

    def optim_step(self) -> Future[dict[str, float]]:
        norm = grad_norm_and_clip(self.model, self.optim_cfg.max_grad_norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        stats, self._pending = self._reduce_stats(self._pending), {}
        return done({**stats, "grad_norm": norm})

    def _reduce_stats(self, stats: dict[str, float]) -> dict[str, float]:
        return stats

    def save_checkpoint(self, directory: str | Path) -> None:
        dcp_io.save_sharded(self.model, self.optimizer, Path(directory))

    def load_checkpoint(self, directory: str | Path) -> None:
        dcp_io.load_sharded(self.model, self.optimizer, Path(directory))


class LocalBackend(AccumulatingBackend):
    """One process, the whole model. Synchronous: every future is already done."""

    def __init__(self, model: nn.Module, optim: OptimConfig, loss_fn: LossFn,
                 device: torch.device | None = None) -> None:
        self.rank, self.world_size = 0, 1
        self.device = device or torch.device("cpu")
        super().__init__(model.to(self.device), optim, loss_fn)

    def get_weights(self) -> dict[str, torch.Tensor]:
        """The policy's whole weights as a plain model of its architecture (LoRA merged)."""
        state = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return merged_weights(self.model, state)

    def full_state(self) -> dict[str, Any]:
        return dcp_io.full_state(self.model, self.optimizer, rank0_only=False)

    def load_weights(self, state: dict[str, torch.Tensor]) -> None:
        self.model.load_state_dict(state)

    def barrier(self) -> None:
        return None
