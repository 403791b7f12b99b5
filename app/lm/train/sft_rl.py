"""The `sft`, `rl` and `sft+rl` runs: loops + checkpoints + resume, over any backend.

    <run_dir>/sft/step_N/...   SFT checkpoints (DCP + trainer_state.json + COMPLETE), `latest`
    <run_dir>/rl/step_N/...    GRPO checkpoints
    <run_dir>/metrics.jsonl    one JSON line per step (rank 0)

A run resumes its phase from that phase's newest COMPLETE checkpoint (steps compared as
integers; a directory without the marker does not count). GRPO of an `sft+rl` run starts from
the newest complete SFT checkpoint, never from whatever weights happen to be in memory, so a
run killed between the phases continues exactly as one that was not.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.lm.rollout.engine import Engine
from app.lm.tasks import Task
from app.lm.train.backend import TrainingBackend
from app.lm.train.checkpoint_dirs import (
    load_training_checkpoint,
    newest_complete,
    save_training_checkpoint,
)
from app.lm.data_buffer import DataBuffer
from app.lm.train.loops import RLConfig, SFTConfig, rl_loop, sft_loop, sft_rows

Mode = Literal["sft", "rl", "sft+rl"]


class NoSFTCheckpoint(RuntimeError):
    """GRPO of an sft+rl run found no complete SFT checkpoint to start from."""


@dataclass(frozen=True)
class RunConfig:
    sft: SFTConfig = field(default_factory=SFTConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    sft_lr: float = 2e-3
    rl_lr: float = 2e-3
    prompts: int = 400
    seed: int = 0
    checkpoint_every: int = 20


def set_lr(backend: TrainingBackend, lr: float) -> None:
    for group in backend.optimizer.param_groups:  # type: ignore[attr-defined]
        group["lr"] = lr


def checkpoint_hook(backend: TrainingBackend, root: Path, run_dir: Path, phase: str, last: int, every: int,
                    buffer: DataBuffer, extra: Callable[[int, dict], None] | None,
                    save: bool = True) -> Callable[[int, dict], None]:
    """Per step: a metrics line (rank 0), a checkpoint every `every` steps and at `last`
    (unless `save` is off), then the caller's `extra`."""
    def on_step(step: int, stats: dict[str, Any]) -> None:
        if backend.rank == 0:
            with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"phase": phase, **stats}) + "\n")
        if save and (step % every == 0 or step == last):
            save_training_checkpoint(backend, root, step, {"phase": phase, "buffer": buffer.state_dict()})
        if extra:
            extra(step, stats)
    return on_step


def run(backend: TrainingBackend, engine: Engine, task: Task, tokenizer, run_dir: str | Path, cfg: RunConfig,
        mode: Mode = "sft+rl", on_step: Callable[[int, dict], None] | None = None) -> dict[str, Any]:
    """Every rank calls this. Returns what was done: the step each phase started from and ended at."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    prompts = task.make_prompts(cfg.prompts, cfg.seed, "train")
    report: dict[str, Any] = {}
    if mode in ("sft", "sft+rl"):
        buffer = DataBuffer(sft_rows(task, tokenizer, prompts), cfg.seed)
        start = resume_phase(backend, run_dir / "sft", buffer)
        set_lr(backend, cfg.sft_lr)
        sft_loop(backend, tokenizer, buffer, cfg.sft, start_step=start,
                 on_step=checkpoint_hook(backend, run_dir / "sft", run_dir, "sft", cfg.sft.steps, cfg.checkpoint_every,
                               buffer, on_step))
        report["sft"] = {"from": start, "to": cfg.sft.steps}
    if mode in ("rl", "sft+rl"):
        buffer = DataBuffer(prompts, cfg.seed + 1)
        start = resume_phase(backend, run_dir / "rl", buffer)
        if start == 0 and mode == "sft+rl":
            found = newest_complete(run_dir / "sft")
            if found is None:
                raise NoSFTCheckpoint(f"{run_dir / 'sft'}: no complete SFT checkpoint to start GRPO from")
            load_training_checkpoint(backend, found[1])
            report["rl_base"] = str(found[1])
        set_lr(backend, cfg.rl_lr)
        engine.load_weights(backend.get_weights(), start)
        rl_loop(backend, engine, task, tokenizer, buffer, cfg.rl, start_step=start,
                on_step=checkpoint_hook(backend, run_dir / "rl", run_dir, "rl", cfg.rl.steps, cfg.checkpoint_every,
                              buffer, on_step))
        report["rl"] = {"from": start, "to": cfg.rl.steps}
    return report


def resume_phase(backend: TrainingBackend, root: Path, buffer: DataBuffer) -> int:
    """The step to continue after (0: none), with the model, optimizer and buffer restored."""
    found = newest_complete(root)
    if found is None:
        return 0
    state = load_training_checkpoint(backend, found[1])
    buffer.load_state_dict(state["buffer"])
    return int(state["step"])
