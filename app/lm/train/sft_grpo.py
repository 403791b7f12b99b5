"""The one language-model training run: SFT, then GRPO, with checkpoints and resume, over any
backend and any rollout source (rollout_sources.py). The mesh's generations (generation.py,
groups stored earlier) and scripts/sft_rl.py (groups generated as it trains) both run it.

    <run_dir>/sft/step_N/...   SFT checkpoints (DCP + trainer_state.json + COMPLETE), `latest`
    <run_dir>/rl/step_N/...    GRPO checkpoints
    <run_dir>/metrics.jsonl    one JSON line per step (rank 0)

Every rank runs it the same way: each draws the same global batch from its DataBuffer (same
seed, same state), trains on its share and divides its loss by the global batch's trained-token
count, so a step is the same at any world size. A phase resumes from its newest COMPLETE
checkpoint (steps compared as integers; a directory without the marker does not count). GRPO
after SFT starts from the newest complete SFT checkpoint, never from whatever weights happen to
be in memory, so a run killed between the phases continues exactly as one that was not. A run
with `save` off (ranks on several nodes, no shared disk) neither resumes nor writes checkpoints.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from app.lm.data_buffer import DataBuffer
from app.lm.tasks import Prompt, Task, prompt_token_ids
from app.lm.train.backend import LossFn, TrainingBackend, wait
from app.lm.train.batching import TrainSequence, chunk, collate, sft_sequence
from app.lm.train.checkpoint_dirs import load_training_checkpoint, newest_complete, save_training_checkpoint
from app.lm.train.grpo import sft_loss
from app.lm.train.rollout_sources import Resumable, RolloutSource
from app.shared.process_group import rank_share, take_share

StepHook = Callable[[int, dict[str, Any]], None]
PhaseHook = Callable[[str, int, dict[str, Any]], None]  # (phase, step, stats)
PhaseStart = Callable[[str, int, int], None]  # (phase, first step, last step): a phase (re)starts


class NoSFTCheckpoint(RuntimeError):
    """GRPO after SFT found no complete SFT checkpoint to start from."""


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 60
    batch_size: int = 32  # sequences per global batch
    micro_batch_size: int = 32


@dataclass(frozen=True)
class RunPlan:
    """What one run does: an SFT phase of `sft.steps` steps (None: no SFT phase), then
    `rl_steps` GRPO steps (0: no GRPO phase)."""

    sft: SFTConfig | None
    sft_lr: float
    rl_steps: int
    rl_lr: float
    seed: int = 0  # the SFT demonstrations' order (the rollout source has its own buffer)
    checkpoint_every: int = 20
    save: bool = True  # checkpoints (and resume from them)
    rl_warmup: int = 0  # GRPO's learning rate rises linearly to rl_lr over these first steps
    keep_checkpoints: int = 1  # the newest complete checkpoints kept in each phase (0: every one)

    def rl_lr_at(self, step: int) -> float:
        """The learning rate of GRPO step `step` (1-based): a pure function, so a resumed run
        continues the schedule where it stopped."""
        return self.rl_lr * min(1.0, step / self.rl_warmup) if self.rl_warmup else self.rl_lr


def train_on(backend: TrainingBackend, rows: Sequence[TrainSequence], pad_id: int, micro: int, loss_fn: LossFn,
             normalizer: float, most_rows: int, with_rl: bool) -> dict[str, float]:
    """One optimizer step over this rank's `rows`, in micro-batches; every rank runs as many
    micro-batches as the rank with the most rows (`most_rows`), so the collectives pair up."""
    for part in chunk(rows, micro, count=max(1, -(-most_rows // micro))):
        wait(backend.forward_backward(collate(part, pad_id, normalizer, with_rl=with_rl), loss_fn))
    return wait(backend.optim_step())


def sft_rows(task: Task, tokenizer: Any, prompts: Sequence[Prompt]) -> list[TrainSequence]:
    """prompt (as a rollout tokenizes it) -> demonstration + EOS, trained on the demonstration only."""
    rows = []
    for p in prompts:
        completion = tokenizer(task.demonstration(p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(sft_sequence(prompt_token_ids(tokenizer, p), completion))
    return rows


def sft_loop(backend: TrainingBackend, tokenizer: Any, rows: DataBuffer, cfg: SFTConfig, *, start_step: int = 0,
             on_step: StepHook | None = None) -> list[dict[str, Any]]:
    """Steps start_step+1 .. cfg.steps of supervised fine-tuning on a buffer of TrainSequences."""
    history = []
    most = rank_share(cfg.batch_size, 0, backend.world_size)[1]
    for step in range(start_step + 1, cfg.steps + 1):
        batch = rows.next_batch(cfg.batch_size)
        normalizer = float(sum(r.trained_tokens for r in batch))
        mine = take_share(batch, backend.rank, backend.world_size)
        stats = {"step": step, **train_on(backend, mine, tokenizer.pad_token_id, cfg.micro_batch_size, sft_loss,
                                          normalizer, most, with_rl=False)}
        history.append(stats)
        if on_step:
            on_step(step, stats)
    return history


def grpo_step(backend: TrainingBackend, source: RolloutSource, pad_id: int, loss_fn: LossFn,
              step: int) -> dict[str, Any]:
    """One GRPO update: the source's groups, one optimizer step, the source told it happened.
    A timed source's step reports its split: rollout_s (generation, without the rewards),
    reward_s (the reward pool), train_s and sync_s (the engines loading the new weights)."""
    t0 = time.perf_counter()
    batch = source.batch(backend, step)
    t1 = time.perf_counter()
    stats = train_on(backend, batch.rows, pad_id, batch.micro, loss_fn, max(batch.tokens, 1.0), batch.most_rows,
                     with_rl=True)
    t2 = time.perf_counter()
    source.trained(backend, step)
    t3 = time.perf_counter()
    seen = max(stats.get("tokens", 0.0), 1.0)
    out = {"step": step, **stats, **batch.stats, "trained_tokens": batch.tokens,
           "mean_ratio": stats.get("ratio_sum", 0.0) / seen, "clip_fraction": stats.get("clipped_tokens", 0.0) / seen}
    if "kl_sum" in stats:
        out["kl"] = stats["kl_sum"] / seen
    if "tis_weight_sum" in stats:  # the behaviour correction (grpo.py): its mean weight and how often it was capped
        out["tis_mean_weight"] = stats["tis_weight_sum"] / seen
        out["tis_truncated_fraction"] = stats["tis_truncated_tokens"] / seen
    if source.timed:
        reward_s = float(batch.stats.get("reward_s", 0.0))
        out.update(rollout_s=t1 - t0 - reward_s, reward_s=reward_s, train_s=t2 - t1, sync_s=t3 - t2)
    else:
        out.pop("reward_s", None)
    return out


def grpo_loop(backend: TrainingBackend, source: RolloutSource, pad_id: int, loss_fn: LossFn, steps: int, *,
              start_step: int = 0, on_step: StepHook | None = None,
              lr_at: Callable[[int], float] | None = None) -> list[dict[str, Any]]:
    """GRPO steps start_step+1 .. steps, each at `lr_at(step)` when given."""
    source.begin(backend, start_step)
    history = []
    for step in range(start_step + 1, steps + 1):
        if lr_at is not None:
            set_lr(backend, lr_at(step))
        stats = grpo_step(backend, source, pad_id, loss_fn, step)
        if lr_at is not None:
            stats["lr"] = lr_at(step)
        history.append(stats)
        if on_step:
            on_step(step, stats)
    return history


def run(backend: TrainingBackend, tokenizer: Any, run_dir: str | Path, plan: RunPlan, *,
        demonstrations: Sequence[TrainSequence], source: RolloutSource, loss_fn: LossFn,
        reference: nn.Module | None = None, reference_is_start: bool = True,
        on_step: PhaseHook | None = None, on_phase: PhaseStart | None = None,
        continue_from: Path | None = None) -> dict[str, Any]:
    """Every rank calls this. Returns what was done: the step each phase started from and ended
    at, the SFT checkpoint GRPO started from (`rl_base`), and the last GRPO step's stats
    (`final`, empty when no step was left to run). `reference` (KL on; the one `loss_fn` holds)
    gets the weights GRPO starts from, unless it is a fixed model (`reference_is_start` False:
    loaded from a directory by app/lm/train/reference.py). `continue_from`: the previous run's
    last GRPO checkpoint (continuation.py), loaded (weights and optimizer) when this run has no
    GRPO checkpoint of its own yet."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    hook = lambda phase: None if on_step is None else (lambda step, stats: on_step(phase, step, stats))  # noqa: E731
    if plan.sft is not None:
        rows = DataBuffer(demonstrations, plan.seed)
        start = resume_phase(backend, run_dir / "sft", rows) if plan.save else 0
        set_lr(backend, plan.sft_lr)
        if on_phase:
            on_phase("sft", start + 1, plan.sft.steps)
        sft_loop(backend, tokenizer, rows, plan.sft, start_step=start,
                 on_step=checkpoint_hook(backend, run_dir / "sft", run_dir, "sft", plan.sft.steps, plan.checkpoint_every,
                                         rows, hook("sft"), save=plan.save, keep=plan.keep_checkpoints))
        report["sft"] = {"from": start, "to": plan.sft.steps}
    if not plan.rl_steps:
        return report
    if plan.sft is not None and plan.save:  # GRPO starts from the saved SFT result (the hook saves the last step)
        found = newest_complete(run_dir / "sft")
        if found is None:
            raise NoSFTCheckpoint(f"{run_dir / 'sft'}: no complete SFT checkpoint to start GRPO from")
        load_training_checkpoint(backend, found[1])
        report["rl_base"] = str(found[1])
    if continue_from is not None and plan.sft is None:
        steps = None  # resumed below from this run's own checkpoint, which continued it before
        if not (plan.save and newest_complete(run_dir / "rl")):
            load_training_checkpoint(backend, continue_from)  # the parent's weights, with its optimizer's state
            steps = optimizer_steps(backend)
        report["continued_from"] = {"checkpoint": str(continue_from), "optimizer_steps": steps}
    if reference is not None and reference_is_start:
        reference.load_state_dict(backend.get_weights())  # the policy GRPO starts from
    start = resume_phase(backend, run_dir / "rl", source.buffer) if plan.save else 0
    set_lr(backend, plan.rl_lr)
    if on_phase:
        on_phase("rl", start + 1, plan.rl_steps)
    history = grpo_loop(backend, source, tokenizer.pad_token_id, loss_fn, plan.rl_steps, start_step=start,
                        on_step=checkpoint_hook(backend, run_dir / "rl", run_dir, "rl", plan.rl_steps,
                                                plan.checkpoint_every, source.buffer, hook("rl"), save=plan.save,
                                                keep=plan.keep_checkpoints),
                        lr_at=plan.rl_lr_at)
    report["rl"] = {"from": start, "to": plan.rl_steps}
    report["final"] = history[-1] if history else {}
    return report


def optimizer_steps(backend: TrainingBackend) -> int | None:
    """The steps the optimizer's state has taken (AdamW's `step`), None before its first."""
    for state in backend.optimizer.state.values():  # type: ignore[attr-defined]
        step = state.get("step")
        if step is not None:
            return int(step.item() if hasattr(step, "item") else step)
    return None


def set_lr(backend: TrainingBackend, lr: float) -> None:
    for group in backend.optimizer.param_groups:  # type: ignore[attr-defined]
        group["lr"] = lr


def checkpoint_hook(backend: TrainingBackend, root: Path, run_dir: Path, phase: str, last: int, every: int,
                    buffer: Resumable, extra: StepHook | None, save: bool = True, keep: int = 1) -> StepHook:
    """Per step: a metrics line (rank 0), a checkpoint every `every` steps and at `last`
    (unless `save` is off; the newest `keep` kept), then the caller's `extra`."""
    every = max(1, every)

    def on_step(step: int, stats: dict[str, Any]) -> None:
        if backend.rank == 0:
            with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"phase": phase, **stats}) + "\n")
        if save and (step % every == 0 or step == last):
            state = buffer.state_dict()
            save_training_checkpoint(backend, root, step, {"phase": phase, "buffer": state,
                                                          "rank_buffers": rank_states(backend, state)}, keep=keep)
        if extra:
            extra(step, stats)
    return on_step


def resume_phase(backend: TrainingBackend, root: Path, buffer: Resumable) -> int:
    """The step to continue after (0: none), with the model, optimizer and buffer restored."""
    found = newest_complete(root)
    if found is None:
        return 0
    state = load_training_checkpoint(backend, found[1])
    mine = state.get("rank_buffers")
    buffer.load_state_dict(mine[backend.rank] if mine and len(mine) == backend.world_size else state["buffer"])
    return int(state["step"])


def rank_states(backend: TrainingBackend, state: dict[str, Any]) -> list[dict[str, Any]] | None:
    """Every rank's buffer state at rank 0 (a collective), when there are several ranks: an
    online run's ranks each play their own prompts and carry their own groups, so each resumes
    from its own (rank 0's alone would hand rank 1 rank 0's carried groups, trained twice). A
    run resumed at another world size starts every rank from rank 0's."""
    env = getattr(backend, "env", None)
    if env is None or backend.world_size == 1:
        return None
    return env.gather_objects(state)
