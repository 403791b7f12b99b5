"""Completions -> scored Samples -> Groups, keyed by prompt, and the group filter.

Results are put together by `prompt_id` and `group_index`, never by the order completions
came back in, so an engine that answers out of order (or in pieces) cannot mix groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from app.lm.reward_pool import REWARD_FAILURES, RewardScorer
from app.lm.rollout.agent import ContextBuilder, append_observation, run_episodes
from app.lm.rollout.engine import Engine
from app.lm.samples import Group, Sample
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings


@dataclass(frozen=True)
class GroupRequest:
    """Which completions of a prompt's group are wanted (a partial group asks for the rest)."""

    prompt: Prompt
    group_indices: tuple[int, ...]


Producer = Callable[[Sequence[GroupRequest], int], list[Sample]]
# why a group is not trained on ("consumed": its uid was trained already, app/lm/train/consumed.py)
DROP_REASONS = (*REWARD_FAILURES, "overlong", "zero_variance", "stale", "consumed")


def group_samples(samples: Iterable[Sample]) -> dict[str, list[Sample]]:
    """Samples keyed by prompt, each list sorted by group index; a repeated index is an error."""
    by_prompt: dict[str, dict[int, Sample]] = {}
    for s in samples:
        slot = by_prompt.setdefault(s.prompt_id, {})
        if s.group_index in slot:
            raise ValueError(f"prompt {s.prompt_id}: completion {s.group_index} arrived twice")
        slot[s.group_index] = s
    return {pid: [slot[i] for i in sorted(slot)] for pid, slot in by_prompt.items()}


def make_group(prompt_id: str, samples: list[Sample], uid: str = "") -> Group:
    """The group's version is its oldest sample's: staleness is judged by the worst case."""
    return Group(prompt_id=prompt_id, samples=samples, weight_version=min(s.weight_version for s in samples), uid=uid)


def generate_groups(engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt],
                    settings: RolloutSettings, *, seed: int, builder: ContextBuilder = append_observation,
                    rewards: RewardScorer | None = None) -> list[Group]:
    """`settings.n` scored episodes per prompt, one Group per prompt in the prompts' order."""
    ids = [p.prompt_id for p in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError("prompts must have distinct prompt_ids: groups are keyed by prompt")
    requests = [(p, i) for p in prompts for i in range(settings.n)]
    grouped = group_samples(run_episodes(engine, task, tokenizer, requests, settings, seed=seed, builder=builder,
                                         rewards=rewards))
    return [make_group(pid, grouped[pid]) for pid in ids]


def generate_group(engine: Engine, task: Task, tokenizer, prompt: Prompt, settings: RolloutSettings,
                   *, seed: int, builder: ContextBuilder = append_observation) -> Group:
    return generate_groups(engine, task, tokenizer, [prompt], settings, seed=seed, builder=builder)[0]


def generate_for(engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt], settings: RolloutSettings,
                 seed: int) -> list[Group]:
    """One group per prompt, in order. A batch that crosses an epoch boundary can hold a prompt
    twice; groups are keyed by prompt, so such a batch is generated in runs of distinct prompts."""
    groups: list[Group] = []
    start = 0
    while start < len(prompts):
        seen: set[str] = set()
        end = start
        while end < len(prompts) and prompts[end].prompt_id not in seen:
            seen.add(prompts[end].prompt_id)
            end += 1
        groups += generate_groups(engine, task, tokenizer, prompts[start:end], settings, seed=seed + start)
        start = end
    return groups


def engine_producer(engine: Engine, task: Task, tokenizer, settings: RolloutSettings,
                    builder: ContextBuilder = append_observation, rewards: RewardScorer | None = None) -> Producer:
    """A `Producer` for the rollout manager: plays exactly the requested completions."""

    def produce(requests: Sequence[GroupRequest], seed: int) -> list[Sample]:
        flat = [(r.prompt, i) for r in requests for i in r.group_indices]
        return run_episodes(engine, task, tokenizer, flat, settings, seed=seed, builder=builder, rewards=rewards)

    return produce


def filter_reason(group: Group, zero_variance: str = "drop", min_reward_std: float = 1e-6) -> str | None:
    """Why a complete group is dropped, or None to keep it.

    "reward_error" / "reward_nonfinite" / "reward_timeout": a sample's reward failed (its value
    is no reward at all, so neither is the group's baseline);
    "overlong": a sample was cut at max_seq_len and the setting says drop its group;
    "zero_variance": every reward equal, so every GRPO advantage is zero (no signal), when
    `zero_variance` is "drop".
    """
    for s in group.samples:
        if s.metadata.get("reward_failure"):
            return str(s.metadata["reward_failure"])
    if any(s.metadata.get("overlong") == "drop_group" for s in group.samples):
        return "overlong"
    rewards = group.rewards
    if zero_variance == "drop" and (len(rewards) < 2 or max(rewards) - min(rewards) <= min_reward_std):
        return "zero_variance"
    return None
