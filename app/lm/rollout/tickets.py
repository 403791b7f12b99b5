"""Ticket-parallel rollout: W ranks generate the groups of each global batch of B prompts.

A ticket is one prompt of the batch (its whole group is generated on one rank, so groups are
never split). Per global batch rank 0 broadcasts the guidance: the continue flag, the batch's
tickets (drawn from its DataBuffer, whose epoch order is `Random(seed + epoch)` of the prompt
list) and the sampling seed. Rank r takes B//W + (r < B%W) tickets at an offset no other
rank covers; every rank, also one without a ticket, joins the gather; rank 0 alone writes,
each batch as one atomic file, then `manifest.json`. The group is created with a timeout, so
a rank that hangs makes the others' collectives fail and the run end with an error.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json, atomic_write_text
from app.lm.rollout.engine import Engine
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings
from app.lm.data_buffer import DataBuffer
from app.lm.rollout.groups import generate_for
from app.shared.process_group import DistContext, rank_share

HANG_ENV = "LM_ROLLOUT_TEST_HANG_RANK"  # tests only: this rank stops answering after its first batch


@dataclass(frozen=True)
class RolloutJob:
    batch_size: int  # tickets (prompts) per global batch
    batches: int
    settings: RolloutSettings
    seed: int = 0
    weight_version: int = 0


def guidance_for(buffer: DataBuffer, job: RolloutJob, index: int) -> dict[str, Any]:
    """What rank 0 tells every rank about global batch `index` (pure but for the buffer's position)."""
    if index >= job.batches:
        return {"continue": False}
    tickets = buffer.next_batch(job.batch_size)
    return {"continue": True, "batch": index, "tickets": tickets, "epoch": buffer.epoch,
            "seed": job.seed * 1_000_003 + index, "weight_version": job.weight_version}


def my_tickets(tickets: Sequence[int], rank: int, world: int) -> tuple[int, list[int]]:
    offset, count = rank_share(len(tickets), rank, world)
    return offset, list(tickets[offset:offset + count])


def run_rollout(env: DistContext, engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt], job: RolloutJob,
                out_dir: Path) -> dict[str, Any] | None:
    """Every rank calls this; rank 0 returns the manifest (others None)."""
    buffer = DataBuffer(list(range(len(prompts))), job.seed) if env.is_main else None
    hang_rank = os.environ.get(HANG_ENV)
    written: list[str] = []
    started = time.perf_counter()
    index = 0
    while True:
        guidance = env.broadcast(guidance_for(buffer, job, index) if env.is_main else None)
        if not guidance["continue"]:
            break
        offset, mine = my_tickets(guidance["tickets"], env.rank, env.world_size)
        if hang_rank is not None and int(hang_rank) == env.rank and index > 0:
            time.sleep(3600)  # a stuck rank: its peers must fail at the group's timeout
        groups = generate_for(engine, task, tokenizer, [prompts[i] for i in mine], job.settings,
                              seed=guidance["seed"] + offset)
        results = [{"ticket": t, "rank": env.rank, "group": g.to_dict()} for t, g in zip(mine, groups)]
        gathered = env.gather_objects(results)
        if env.is_main:
            rows = [r for part in gathered or [] for r in part]
            name = f"batch_{guidance['batch']:06d}.jsonl"
            atomic_write_text(out_dir / name, "".join(json.dumps(r) + "\n" for r in rows))
            written.append(name)
        index += 1
    if not env.is_main:
        return None
    manifest = {"batches": written, "world_size": env.world_size, "batch_size": job.batch_size,
                "group_size": job.settings.n, "weight_version": job.weight_version, "seed": job.seed,
                "wall_s": time.perf_counter() - started}
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def read_rollouts(out_dir: Path) -> list[dict[str, Any]]:
    """Every (ticket, rank, group) row of a finished rollout directory, in batch order."""
    manifest = json.loads((out_dir / "manifest.json").read_text(encoding="utf-8"))
    rows = []
    for name in manifest["batches"]:
        rows += [json.loads(line) for line in (out_dir / name).read_text(encoding="utf-8").splitlines() if line]
    return rows
