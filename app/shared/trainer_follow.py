"""A trainer that stays: the node hands a running torchrun trainer its next generation.

A generation's trainer used to be one torchrun launch: every generation paid the launch (the
ranks import torch and the model library, load the parent, build the task, start the reward
pool: ~8 s of a ~17 s generation on the LM user task) and dropped the optimizer's state, which
`--continue-from` then read back from a checkpoint. TRL, verl and slime keep one trainer
process for the whole run. Here a trainer launched with `--follow FILE` stays after its
generation and waits (bounded) for the node to write FILE with the next one: the run dir,
dataset and parent it would have been launched with. It trains that generation with the
weights and optimizer it holds when the parent is its own last candidate, and otherwise exits
(the node then launches a fresh one, which continues from the checkpoints as before).

The file is the whole protocol: written by the node (temp name, fsync, rename), read by rank
0, its decision broadcast to every rank. A request names the generation it is for, so a
trainer never takes one twice or an old one.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json

POLL_S = 0.5  # rank 0 reads the file this often; every rank meets it in one broadcast a poll


@dataclass(frozen=True)
class FollowRequest:
    """The next generation, as the node would launch it."""

    generation: int
    run_dir: str
    dataset: str
    parent: str
    parent_sha256: str

    @classmethod
    def from_json(cls, data: Any) -> FollowRequest | None:
        """None for anything but a whole request (a trainer never acts on a half one)."""
        if not isinstance(data, dict):
            return None
        try:
            request = cls(generation=int(data["generation"]), run_dir=str(data["run_dir"]),
                          dataset=str(data["dataset"]), parent=str(data["parent"]),
                          parent_sha256=str(data["parent_sha256"]))
        except (KeyError, TypeError, ValueError):
            return None
        return request if request.generation >= 1 else None


def write_request(path: Path, request: FollowRequest) -> None:
    """The node's side: the next generation for the trainer that follows `path`."""
    atomic_write_json(path, asdict(request))


def read_request(path: Path, after: int) -> FollowRequest | None:
    """A request for a generation after `after`, if the file holds one."""
    try:
        request = FollowRequest.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None
    return request if request is not None and request.generation > after else None


def wait_for_request(env: Any, path: Path, after: int, wait_s: float) -> FollowRequest | None:
    """Every rank: the next request rank 0 reads within `wait_s`, or None. Each poll is one
    broadcast, so the ranks wait together and a group timeout never fires while they idle."""
    deadline = time.monotonic() + wait_s
    while True:
        found = read_request(path, after) if env.is_main else None
        expired = time.monotonic() >= deadline if env.is_main else None
        found, expired = env.broadcast((found, expired))
        if found is not None or expired:
            return found
        time.sleep(POLL_S)
