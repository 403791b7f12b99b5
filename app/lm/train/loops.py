"""SFT and GRPO as plain functions over a training backend (and, for GRPO, a generation engine).

Both run the same on one process and under torchrun: every rank draws the same global batch
from its DataBuffer (same seed, same state), takes its share by `take_share`, and divides its
loss by the global batch's trained-token count, so the step is the same at any world size.
In GRPO each rank generates the groups of its share of the prompts with its own engine
(groups are whole on one rank, so advantages need no exchange); only the token count is
summed across ranks. After each optimizer step the engine gets the new weights with the step
as their version. `on_step(step, stats)` is the caller's hook for logging and checkpoints.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.lm.rollout.engine import Engine
from app.lm.rollout.groups import generate_for
from app.lm.samples import Group
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings
from app.lm.train.backend import TrainingBackend, wait
from app.lm.train.batching import (
    TrainSequence,
    chunk,
    collate,
    sequences_from_samples,
    sft_sequence,
)
from app.shared.process_group import rank_share, take_share
from app.lm.data_buffer import DataBuffer
from app.lm.train.grpo import GRPOConfig, group_advantages, grpo_loss, sft_loss

StepHook = Callable[[int, dict[str, Any]], None]


@dataclass(frozen=True)
class SFTConfig:
    steps: int = 60
    batch_size: int = 32  # sequences per global batch
    micro_batch_size: int = 32


@dataclass(frozen=True)
class RLConfig:
    steps: int = 150
    prompts_per_step: int = 16
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings(n=8, max_new_tokens=8))
    micro_batch_size: int = 64  # sequences per forward/backward
    grpo: GRPOConfig = field(default_factory=GRPOConfig)
    scale_by_std: bool = True
    shuffle_advantages: bool = False  # control run: advantages permuted across the batch (no credit)
    seed: int = 0


def all_reduce_sum(backend: TrainingBackend, values: list[float]) -> list[float]:
    reducer = getattr(backend, "env", None)
    return reducer.all_reduce_floats(values) if reducer is not None else list(values)  # one rank: the values


def train_on(backend: TrainingBackend, rows: Sequence[TrainSequence], pad_id: int, micro: int, loss_fn,
             normalizer: float, most_rows: int, with_rl: bool) -> dict[str, float]:
    """One optimizer step over this rank's `rows`, in micro-batches; every rank runs as many
    micro-batches as the rank with the most rows (`most_rows`), so the collectives pair up."""
    for part in chunk(rows, micro, count=max(1, -(-most_rows // micro))):
        wait(backend.forward_backward(collate(part, pad_id, normalizer, with_rl=with_rl), loss_fn))
    return wait(backend.optim_step())


def sft_rows(task: Task, tokenizer, prompts: Sequence[Prompt]) -> list[TrainSequence]:
    """prompt (with BOS) -> demonstration + EOS, trained on the demonstration only."""
    rows = []
    for p in prompts:
        completion = tokenizer(task.demonstration(p), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(sft_sequence(tokenizer(p.text)["input_ids"], completion))
    return rows


def sft_loop(backend: TrainingBackend, tokenizer, rows: DataBuffer, cfg: SFTConfig, *, start_step: int = 0,
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


def advantages_for(groups: Sequence[Group], cfg: RLConfig, step: int) -> list[float]:
    advs = [a for g in groups for a in group_advantages(g.rewards, cfg.scale_by_std)]
    if cfg.shuffle_advantages:
        random.Random(cfg.seed * 7919 + step).shuffle(advs)
    return advs


def rl_step(backend: TrainingBackend, engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt],
            cfg: RLConfig, step: int) -> dict[str, Any]:
    """Rollout of this rank's share of `prompts` (the global batch), one GRPO update, weight sync."""
    t0 = time.perf_counter()
    mine = take_share(prompts, backend.rank, backend.world_size)
    offset = rank_share(len(prompts), backend.rank, backend.world_size)[0]
    groups = generate_for(engine, task, tokenizer, mine, cfg.rollout, seed=cfg.seed * 1_000_003 + step * 1_009 + offset)
    t1 = time.perf_counter()
    samples = [s for g in groups for s in g.samples]
    rows = sequences_from_samples(samples, advantages_for(groups, cfg, step))
    tokens, reward_sum, gen_tokens = all_reduce_sum(backend, [
        float(sum(r.trained_tokens for r in rows)), float(sum(s.reward for s in samples)),
        float(sum(len(s.response_tokens) for s in samples))])
    most = rank_share(len(prompts), 0, backend.world_size)[1] * cfg.rollout.n
    loss_fn = lambda logits, batch: grpo_loss(logits, batch, cfg.grpo)
    stats = train_on(backend, rows, tokenizer.pad_token_id, cfg.micro_batch_size, loss_fn, max(tokens, 1.0),
                     most, with_rl=True)
    t2 = time.perf_counter()
    engine.load_weights(backend.get_weights(), step)
    t3 = time.perf_counter()
    n_samples = len(prompts) * cfg.rollout.n
    return {"step": step, **stats, "mean_reward": reward_sum / n_samples, "trained_tokens": tokens,
            "generated_tokens": gen_tokens, "rollout_s": t1 - t0, "train_s": t2 - t1, "sync_s": t3 - t2}


def rl_loop(backend: TrainingBackend, engine: Engine, task: Task, tokenizer, prompts: DataBuffer, cfg: RLConfig,
            *, start_step: int = 0, on_step: StepHook | None = None) -> list[dict[str, Any]]:
    """GRPO steps start_step+1 .. cfg.steps; the engine must hold the backend's current weights."""
    history = []
    for step in range(start_step + 1, cfg.steps + 1):
        stats = rl_step(backend, engine, task, tokenizer, prompts.next_batch(cfg.prompts_per_step), cfg, step)
        history.append(stats)
        if on_step:
            on_step(step, stats)
    return history


def groups_step(backend: TrainingBackend, pad_id: int, groups: Sequence[Group], loss_fn, *, micro_batches: int = 1,
                scale_by_std: bool = True, eps: float = 1e-6) -> dict[str, Any]:
    """One GRPO update on groups generated earlier (an exported dataset): every rank passes the
    same global batch and trains on its share of the rows, so the step is the same at any world
    size. `loss_fn` compares with each sample's stored `rollout_logprobs` (off-policy ratio)."""
    samples = [s for g in groups for s in g.samples]
    advs = [a for g in groups for a in group_advantages(g.rewards, scale_by_std, eps)]
    rows = sequences_from_samples(samples, advs)
    tokens = float(sum(r.trained_tokens for r in rows))
    most = rank_share(len(rows), 0, backend.world_size)[1]
    micro = max(1, -(-most // max(1, micro_batches)))
    stats = train_on(backend, take_share(rows, backend.rank, backend.world_size), pad_id, micro, loss_fn,
                     max(tokens, 1.0), most, with_rl=True)
    seen = max(stats.get("tokens", 0.0), 1.0)
    return {**stats, "groups": len(groups), "trained_tokens": tokens,
            "mean_reward": sum(s.reward for s in samples) / max(len(samples), 1),
            "mean_ratio": stats.get("ratio_sum", 0.0) / seen, "clip_fraction": stats.get("clipped_tokens", 0.0) / seen}
