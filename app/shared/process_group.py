"""Joining the process group torchrun describes: which device a rank trains on, and the group.

Both torchrun targets (the game trainer and the language-model jobs) join the same way.
The device comes from LOCAL_RANK (the rank on this node), never from RANK: on a second node
RANK is 8 while the GPUs are 0..7. NCCL needs one GPU per rank, so "auto" picks CUDA only when
this node has a GPU for each of its ranks (LOCAL_WORLD_SIZE); more ranks than GPUs train on the
CPU over gloo instead of failing in `cuda.set_device` with an unhelpful index error, and
"cuda" with too few GPUs is refused with the counts named.

Once joined, a rank talks to its peers through `DistContext`: the few collectives both trainers
use, each a no-op in a one-rank group.
"""

from __future__ import annotations

import datetime as dt
import os
import sys
from dataclasses import dataclass
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from app.free_ports import free_port
from app.shared.gpus import visible_gpus

DEVICE_CHOICES = ("auto", "cpu", "cuda")
T = TypeVar("T")


class DeviceChoiceError(ValueError):
    """The device asked for cannot serve this node's ranks."""


def choose_device(pref: str, local_world_size: int, cuda_devices: int) -> str:
    """"cuda" or "cpu" for every rank of a node with `local_world_size` ranks and `cuda_devices` GPUs.

    Pure, so the rule is tested without a GPU. Every rank of a node decides alike, so a group
    never mixes NCCL and gloo.
    """
    if pref not in DEVICE_CHOICES:
        raise DeviceChoiceError(f"device must be one of {', '.join(DEVICE_CHOICES)}, got {pref!r}")
    if local_world_size < 1:
        raise DeviceChoiceError(f"a node needs at least one rank, got {local_world_size}")
    if pref == "cpu":
        return "cpu"
    enough = cuda_devices >= local_world_size
    if pref == "cuda" and not enough:
        raise DeviceChoiceError(
            f"--device cuda with {local_world_size} rank(s) on this node but {cuda_devices} CUDA device(s) "
            "visible: NCCL needs one GPU per rank; use --nproc auto (one rank per GPU) or --device cpu")
    return "cuda" if enough else "cpu"


def network_device(pref: str) -> torch.device:
    """Where one process's network runs outside a group (a self-play worker, a scorer): any
    number of such processes share the node's first GPU. "cuda" without one is refused."""
    cuda_devices = visible_gpus()
    if pref == "cuda" and cuda_devices == 0:
        raise DeviceChoiceError("device 'cuda' asked for, but no CUDA device is visible (use cpu or auto)")
    return torch.device(choose_device(pref, 1, cuda_devices))


def ensure_torchrun_env() -> None:
    """Make a plain process a one-rank group on a free loopback port (torchrun sets these)."""
    if "RANK" in os.environ:
        return
    port = free_port()
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def join_process_group(device_pref: str, timeout_s: float | None = None) -> tuple[int, int, int, torch.device]:
    """Join (or make) the group; returns (rank, world size, local rank, device).

    One torch thread per rank: several ranks share the node's cores. A timeout makes a rank
    that hangs fail its peers' collectives instead of leaving them waiting forever.
    """
    ensure_torchrun_env()
    torch.set_num_threads(1)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    if choose_device(device_pref, local_world, visible_gpus()) == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        kwargs = {} if timeout_s is None else {"timeout": dt.timedelta(seconds=timeout_s)}
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None, **kwargs)
    return dist.get_rank(), dist.get_world_size(), local_rank, device


@dataclass(frozen=True)
class DistContext:
    """This rank's place in the group and the collectives the trainers use."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled: small control data, checkpoints, an epoch order)."""
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

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum over ranks, in place."""
        if self.world_size > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_reduce_floats(self, values: list[float]) -> list[float]:
        """The sums over ranks of a few numbers (float64 on the rank's device)."""
        if self.world_size == 1:
            return list(values)
        t = self.all_reduce_sum(torch.tensor(values, dtype=torch.float64, device=self.device))
        return [float(x) for x in t.cpu()]

    def barrier(self) -> None:
        if self.world_size > 1:
            dist.barrier()


def init_distributed(device_pref: str, timeout_s: float | None = None) -> DistContext:
    """Join torchrun's group (or make a one-rank group on a free port when run plainly)."""
    return DistContext(*join_process_group(device_pref, timeout_s))


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def run_rank(run: Callable[[DistContext], object], device: str, input_errors: tuple[type[Exception], ...],
             what: str, timeout_s: float | None = None) -> int:
    """The body of a torchrun target's `main`, the same for both workloads: join the group, run,
    leave together (no rank tears the group down while rank 0 still writes). Bad input (a device
    this node cannot serve, or one of `input_errors`) is one line on stderr and exit code 2."""
    try:
        env = init_distributed(device, timeout_s)
    except DeviceChoiceError as exc:
        print(f"{what} input error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        run(env)
        env.barrier()
    except input_errors as exc:
        print(f"{what} input error: {exc}", file=sys.stderr, flush=True)
        return 2
    finally:
        shutdown()
    return 0


# How a global batch is split over the ranks: of B items on W ranks, rank r takes
# B//W + (r < B%W) at an offset no other rank covers, so every item is handled exactly once.
def rank_share(total: int, rank: int, world: int) -> tuple[int, int]:
    """(offset, count) of rank `rank`'s share of `total` items: B//W + (r < B%W) each."""
    if world <= 0 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    base, extra = divmod(total, world)
    count = base + (1 if rank < extra else 0)
    offset = rank * base + min(rank, extra)
    return offset, count


def take_share(items: Sequence[T], rank: int, world: int) -> list[T]:
    offset, count = rank_share(len(items), rank, world)
    return list(items[offset:offset + count])
