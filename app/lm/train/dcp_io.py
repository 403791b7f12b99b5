"""Model + optimizer state through torch.distributed.checkpoint (DCP), sharded or whole.

DCP writes each rank's shards with a global plan in `.metadata`, and reading re-plans for
whoever loads: a checkpoint written by 2 FSDP ranks loads on 1 (a plain module), 2 or 3
ranks. `get_state_dict`/`set_state_dict` translate both plain and FSDP2 modules, and both
parameter-name keyed, so the optimizer state is saved whole: every rank's shard of every
Adam moment, never only rank 0's. These are collectives under a process group: every rank
calls them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


def _state(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    # get_optimizer_state_dict initialises Adam's moments if no step was taken yet, so a
    # fresh optimizer has the slots that loading fills.
    return {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}


def save_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    dcp.save(_state(model, optimizer), checkpoint_id=str(directory), no_dist=not is_distributed())


def load_sharded(model: nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    if not (Path(directory) / ".metadata").is_file():
        raise FileNotFoundError(f"{directory}: not a DCP checkpoint (no .metadata)")
    state = _state(model, optimizer)
    dcp.load(state, checkpoint_id=str(directory), no_dist=not is_distributed())
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


def full_state(model: nn.Module, optimizer: torch.optim.Optimizer | None, rank0_only: bool) -> dict[str, Any]:
    """Whole tensors on CPU. A collective: every rank calls it; with `rank0_only` the other
    ranks get empty dicts (and rank 0 alone holds a copy of the model in memory)."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=rank0_only)
    out: dict[str, Any] = {"model": get_model_state_dict(model, options=opts)}
    if optimizer is not None:
        out["optim"] = get_optimizer_state_dict(model, optimizer, options=opts)
    if not rank0_only:
        out["model"] = {k: v.detach().cpu() for k, v in out["model"].items()}
    return out


def load_full_weights(model: nn.Module, weights: dict[str, torch.Tensor]) -> None:
    """Whole tensors into a plain or sharded module (each rank keeps its shard)."""
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True, strict=True))


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()
