"""Joining the process group torchrun describes, for the language-model jobs.

How a rank picks its device and joins is `app.training.process_group`'s (gloo on CPU, NCCL
on GPU, one GPU per rank); here the group gets a timeout so a rank that hangs makes its peers'
collectives fail (and the run end) instead of waiting forever. Rank 0's small control data (an
epoch order, guidance, a continue flag) travels with `broadcast_object`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from app.training.process_group import join_process_group


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast_object(self, obj: Any) -> Any:
        if self.world_size == 1:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, device=self.device if self.device.type == "cuda" else None)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any] | None:
        """Every rank's `obj` at rank 0 (None elsewhere); every rank must call it."""
        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size if self.is_main else None  # type: ignore[assignment]
        dist.gather_object(obj, out, dst=0)
        return out

    def all_reduce_sum(self, values: list[float]) -> list[float]:
        if self.world_size == 1:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return [float(x) for x in t.cpu()]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def init_distributed(device_pref: str = "auto", timeout_s: float = 300.0) -> DistEnv:
    """Join torchrun's group (or make a one-rank group on a free port when run plainly)."""
    return DistEnv(*join_process_group(device_pref, timeout_s))


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
