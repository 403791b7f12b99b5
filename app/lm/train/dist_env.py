"""Joining the process group torchrun describes, for the language-model jobs.

How a rank picks its device, joins, and talks to its peers is `app.shared.process_group`'s
(gloo on CPU, NCCL on GPU, one GPU per rank; `DistContext`). What is the language-model jobs'
own is the timeout: a rank that hangs in generation or a checkpoint makes its peers'
collectives fail after it, and the run end, instead of waiting forever.
"""

from __future__ import annotations

from app.shared.process_group import DistContext, init_distributed as join_group, shutdown

__all__ = ["GROUP_TIMEOUT_S", "init_distributed", "shutdown"]

GROUP_TIMEOUT_S = 300.0


def init_distributed(device_pref: str = "auto", timeout_s: float = GROUP_TIMEOUT_S) -> DistContext:
    return join_group(device_pref, timeout_s)
