"""Held-out evaluation of the LM workload: candidate and best answer the same prompts
greedily, and the per-prompt rewards go, paired, to the gate (gate.py).

Greedy (temperature 0, one completion) makes an evaluation a pure function of the weights
and the prompts, so two nodes evaluating the same pair agree, and a re-run after a crash
gives the same verdict. The rollouts' truncation rules apply (a "length" finish is a parse
failure). Besides the task's reward (the gate's input), each prompt's exact match is
recorded: it is what people read on /progress even when training uses partial credit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from app.config.lm import LMConfig
from app.lm.reward_pool import RewardScorer
from app.lm.reward_worker import call_reward
from app.lm.rollout.engine import Engine, InProcessEngine
from app.lm.rollout.groups import generate_groups
from app.lm.setup import build_task, build_tokenizer, greedy_settings, heldout_prompts, model_at
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings
from app.lm.workload.gate import GateResult, Method, paired_gate, reward_interval


@dataclass(frozen=True)
class ModelRef:
    """A model to evaluate: its directory (None: the generation-0 model) and weight version."""

    path: str | None
    version: int


@dataclass(frozen=True)
class HeldoutScores:
    """One model's greedy answers: per prompt, in the prompts' order."""

    weight_version: int
    prompt_ids: list[str]
    rewards: list[float]
    exact: list[float]  # 1.0 where the answer is exactly right

    def summary(self, confidence: float = 0.95) -> dict:
        mean, low, high = reward_interval(self.rewards, confidence)
        return {"weight_version": self.weight_version, "prompts": len(self.rewards), "reward": mean,
                "interval": [low, high], "exact_match": sum(self.exact) / len(self.exact)}


@dataclass(frozen=True)
class PairedEvaluation:
    candidate: HeldoutScores
    best: HeldoutScores
    gate: GateResult

    def to_json(self, confidence: float = 0.95) -> dict:
        return {"candidate": self.candidate.summary(confidence), "best": self.best.summary(confidence),
                "gate": self.gate.to_json()}


def _exact_task(task: Task) -> Task | None:
    """The same task judged by exact match, when it has a reward kind to switch."""
    if dataclasses.is_dataclass(task) and hasattr(task, "reward_kind"):
        return dataclasses.replace(task, reward_kind="exact")  # type: ignore[type-var]
    return None


def greedy_scores(engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt],
                  settings: RolloutSettings, rewards: RewardScorer | None = None) -> HeldoutScores:
    """One greedy completion per prompt, scored (by `rewards`: a failed reward counts 0);
    `settings`' n and temperature are overridden."""
    greedy = settings.model_copy(update={"n": 1, "temperature": 0.0})
    groups = generate_groups(engine, task, tokenizer, prompts, greedy, seed=0, rewards=rewards)
    exact_task = _exact_task(task)
    by_id = {p.prompt_id: p for p in prompts}
    rewards, exact = [], []
    for group in groups:
        sample = group.samples[0]
        rewards.append(sample.reward)
        failed = bool(sample.metadata.get("parse_failure") or sample.metadata.get("aborted"))
        if exact_task is None:
            exact.append(float(sample.reward >= 1.0))
        else:
            text = tokenizer.decode(sample.response_tokens, skip_special_tokens=True)
            exact.append(0.0 if failed else float(call_reward(exact_task, by_id[group.prompt_id], text) >= 1.0))
    return HeldoutScores(engine.weight_version, [g.prompt_id for g in groups], rewards, exact)


def evaluate_pair(candidate: Engine, best: Engine, task: Task, tokenizer, prompts: Sequence[Prompt],
                  settings: RolloutSettings, *, confidence: float = 0.95, method: Method = "sign",
                  min_improvement: float = 0.0, bootstrap_samples: int = 2000, seed: int = 0,
                  rewards: RewardScorer | None = None) -> PairedEvaluation:
    """Both models on the same prompts, then the paired gate on their per-prompt rewards."""
    if not prompts:
        raise ValueError("a paired evaluation needs at least one held-out prompt")
    cand = greedy_scores(candidate, task, tokenizer, prompts, settings, rewards)
    base = greedy_scores(best, task, tokenizer, prompts, settings, rewards)
    assert cand.prompt_ids == base.prompt_ids  # generate_groups keeps the prompts' order
    gate = paired_gate(cand.rewards, base.rewards, confidence=confidence, method=method,
                       min_improvement=min_improvement, bootstrap_samples=bootstrap_samples, seed=seed)
    return PairedEvaluation(cand, base, gate)


def heldout_record(lm: LMConfig, candidate: ModelRef, best: ModelRef,
                   rewards: RewardScorer | None = None) -> dict[str, Any]:
    """The LM workload's evaluation: candidate and best greedy on the held-out prompts, paired;
    the record keeps the per-prompt rewards, so the gate can be recomputed from it alone."""
    tokenizer = build_tokenizer(lm.tokenizer)  # its own: a fast tokenizer is not shared across threads
    task = build_task(lm.task, tokenizer)
    engines = [InProcessEngine(model_at(lm.model, ref.path, tokenizer), tokenizer, weight_version=ref.version,
                               name=name) for name, ref in (("candidate", candidate), ("best", best))]
    ev = evaluate_pair(*engines, task, tokenizer, heldout_prompts(task, lm.task), greedy_settings(lm),
                       confidence=lm.eval.confidence, method=lm.eval.method, min_improvement=lm.eval.min_improvement,
                       bootstrap_samples=lm.eval.bootstrap_samples, seed=lm.eval.seed, rewards=rewards)
    return {"kind": "lm_heldout", **ev.to_json(lm.eval.confidence),
            "rewards": {"candidate": ev.candidate.rewards, "best": ev.best.rewards}}
