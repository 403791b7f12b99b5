"""The trainer a generation runs: the model from its parent (or the initial one), the engine's
copy it samples with (online), the KL reference, the backend with its optimizer, the reward
pool. A trainer that stays (app/shared/trainer_follow.py) keeps all of it between generations,
so the next one starts with the weights and optimizer state it ended with, as in a run that
never stopped."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.config.lm import LMConfig
from app.lm.causal_lm import ModelLoadError, load_model
from app.lm.reward_pool import RewardPool
from app.lm.setup import build_task, build_tokenizer, for_training, initial_model, reward_pool
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.fsdp_backend import FSDPBackend
from app.lm.train.grpo import sft_loss
from app.lm.train.reference import reference_model
from app.shared.process_group import DistContext


class LMTrainInputError(RuntimeError):
    """Bad input (config, dataset, parent, run dir): exit code 2 with this message."""


@dataclass
class HeldTrainer:
    """What a trainer that stays holds between generations (app/shared/trainer_follow.py): the
    model with its optimizer in `backend`, the engine's copy, the reward pool; and whose
    candidate its weights are."""

    tok: Any
    task: Any
    rewards: RewardPool | None
    backend: LocalBackend | FSDPBackend
    reference: Any
    sampler: Any
    vocab_size: int
    run_dir: Path | None = None
    candidate_sha256: str | None = None
    # the policies its last run published for rollout workers, renumbered so that its candidate
    # is version 0 (policy_publish.py): the next run still takes their groups
    policies: list[tuple[int, str]] = field(default_factory=list)
    # this rank: the uids its last run read of those policies, not to be taken again (consumed.py)
    carried_uids: set[str] = field(default_factory=set)


def build_model(lm: LMConfig, tok, parent: Path | None):
    if parent is None:
        try:
            return initial_model(lm.model, tok)
        except ModelLoadError as exc:
            raise LMTrainInputError(str(exc)) from None
    try:
        model = load_model(parent, lm.model.dtype, key="--parent", attn_implementation=lm.model.attn_implementation)
    except (OSError, ValueError) as exc:
        raise LMTrainInputError(f"--parent {parent}: cannot load the model: {exc}") from None
    if model.config.vocab_size < len(tok):
        raise LMTrainInputError(f"--parent {parent}: vocabulary {model.config.vocab_size} < tokenizer's {len(tok)}")
    return model


def build_trainer(lm: LMConfig, parent: Path | None, env: DistContext, sft_steps: int,
                  rl_steps: int) -> HeldTrainer:
    """The model from the parent (or the initial one), its engine copy, reference and backend."""
    g = lm.grpo
    tok = build_tokenizer(lm.tokenizer)
    task = build_task(lm.task, tok, need_demonstrations=sft_steps > 0)
    rewards = reward_pool(lm, task) if g.rollouts == "online" and rl_steps > 0 else None
    if rewards is not None:
        rewards.start()  # its workers import the reward's module while the model loads
    try:
        model = build_model(lm, tok, parent)
        vocab_size = int(model.config.vocab_size)
        reference = reference_model(model, g.reference) if g.kl_coef else None
        sampler = copy.deepcopy(model).eval() if rewards is not None else None  # before LoRA wraps the policy
        model = for_training(lm, model, g.seed)  # LoRA: adapters on the policy; the reference stays whole
    except BaseException:
        if rewards is not None:
            rewards.close()
        raise
    optim = OptimConfig(lr=g.lr, weight_decay=g.weight_decay, max_grad_norm=g.max_grad_norm)
    backend = (FSDPBackend(model, optim, sft_loss, env) if env.world_size > 1 or g.backend == "fsdp2"
               else LocalBackend(model, optim, sft_loss, env.device))
    if reference is not None:
        reference.to(env.device)
    return HeldTrainer(tok, task, rewards, backend, reference, sampler, vocab_size)
