"""How well a policy does on a task: exact match and mean reward, greedy or sampled."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from app.lm.rollout.engine import Engine
from app.lm.rollout.groups import generate_groups
from app.lm.samples import Group
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings


@dataclass(frozen=True)
class EvalResult:
    exact_match: float
    mean_reward: float
    samples: int


def exact_matches(groups: Sequence[Group], prompts: Sequence[Prompt], tokenizer) -> list[bool]:
    answers = {p.prompt_id: p.answer for p in prompts}
    return [tokenizer.decode(s.response_tokens, skip_special_tokens=True).strip() == answers[s.prompt_id]
            for g in groups for s in g.samples]


def summarize(groups: Sequence[Group], prompts: Sequence[Prompt], tokenizer) -> EvalResult:
    hits = exact_matches(groups, prompts, tokenizer)
    rewards = [s.reward for g in groups for s in g.samples]
    n = max(1, len(hits))
    return EvalResult(sum(hits) / n, sum(rewards) / max(1, len(rewards)), len(hits))


def evaluate(engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt], *, temperature: float = 0.0,
             n: int = 1, max_new_tokens: int = 16, seed: int = 0) -> EvalResult:
    """Greedy (temperature 0, n 1) or sampled exact match over `prompts`."""
    settings = RolloutSettings(n=n, max_new_tokens=max_new_tokens, temperature=temperature)
    return summarize(generate_groups(engine, task, tokenizer, prompts, settings, seed=seed), prompts, tokenizer)
