"""Agent steps: model steps apart from environment steps, one token trace per episode.

An episode alternates a model step (the engine continues the context until eos, a task stop
marker or `max_new_tokens`) and an environment step (the task's `Episode.step` reads the
model's text and may append an observation, such as a tool result run in process). The
sample's response is the concatenation of the token traces AS GENERATED at rollout time:
model tokens with loss mask 1 and their log-probs, environment tokens with mask 0.

The next context comes from a context builder (default: append the observation's tokens).
A builder that re-renders the conversation (a chat template, a sliding window) may produce a
context that is not the old one extended; then the trained tokens would differ from the
sampled ones, so `check_append_only` stops the rollout with the first differing position.

How an episode ends is recorded apart from the engine's `finish_reason` (see `samples.py`):
the episode's rules (terminated), `max_steps`, the environment ("env"), or `max_seq_len`.

Sampling is reproducible: each model step of an episode is one engine request whose seed is
derived from (the draw's seed, prompt id, sample index, step) (`request_seed`); the draw's seed
is kept in the sample's metadata (`sampling_seed`), so a rollout can be redone. Rewards are
scored together at the end by a reward scorer (app/lm/reward_pool.py); a failed reward leaves
the sample marked (`reward_failure`) and the rollout filter drops its group.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import structlog

from app.lm.reward_pool import InlineRewards, RewardScorer
from app.lm.rollout.engine import Engine
from app.lm.samples import Sample
from app.lm.tasks import Episode, Prompt, Task, prompt_token_ids
from app.lm.truncation import RolloutSettings, reward_rule

log = structlog.get_logger(__name__)


SEED_SPACE = 2**31 - 2**16  # below int32, with room for an engine's seed + completion index


def request_seed(seed: int, prompt_id: str, sample_index: int, step: int = 0) -> int:
    """The seed of one engine request: a pure function of (the draw's seed, prompt, sample, step)."""
    digest = hashlib.sha256(f"{seed}\0{prompt_id}\0{sample_index}\0{step}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % SEED_SPACE


class PrefixMismatchError(RuntimeError):
    """A multi-turn context was not append-only: the trained tokens would not be the sampled ones."""


def check_append_only(previous: Sequence[int], current: Sequence[int], where: str) -> None:
    """`current` must start with `previous`; fail loudly naming the first differing position."""
    if len(current) < len(previous) or list(current[: len(previous)]) != list(previous):
        first = next((i for i, (a, b) in enumerate(zip(previous, current)) if a != b),
                     min(len(previous), len(current)))
        raise PrefixMismatchError(
            f"{where}: context is not append-only: first difference at token {first} "
            f"(had {list(previous[first:first + 4])}, now {list(current[first:first + 4])}; "
            f"lengths {len(previous)} -> {len(current)})")


@dataclass
class Trace:
    """One episode in flight: the prompt, the growing response and its per-token facts."""

    prompt: Prompt
    group_index: int
    prompt_tokens: list[int]
    episode: Episode
    weight_version: int
    response: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    steps: int = 0
    finish_reason: str = "stop"
    done: bool = False
    terminated: bool = False
    truncation_reason: str | None = None
    metadata: dict = field(default_factory=dict)
    first_step_text: tuple[int, str] | None = None  # (response length then, its text): reused when nothing followed

    @property
    def context(self) -> list[int]:
        return self.prompt_tokens + self.response

    def end(self, *, terminated: bool = False, truncation_reason: str | None = None) -> None:
        self.done, self.terminated, self.truncation_reason = True, terminated, truncation_reason


ContextBuilder = Callable[[Trace, list[int]], list[int]]


def append_observation(trace: Trace, observation_tokens: list[int]) -> list[int]:
    """The default builder: the context so far, then the observation's tokens."""
    return trace.context + observation_tokens


def stop_token_ids(task: Task, tokenizer) -> list[int]:
    """Each stop marker must be one token: a marker split in pieces could never stop a step."""
    ids = []
    for marker in task.stop_markers:
        token_id = tokenizer.convert_tokens_to_ids(marker)
        if token_id is None or token_id == tokenizer.unk_token_id:
            raise ValueError(f"task {task.name}: stop marker {marker!r} is not a single token of the tokenizer")
        ids.append(token_id)
    return ids


def _cut_to(trace: Trace, max_seq_len: int) -> bool:
    """Cut the response so prompt + response fit `max_seq_len`; True when something was cut."""
    room = max_seq_len - len(trace.prompt_tokens)
    if len(trace.response) <= room:
        return False
    del trace.response[room:], trace.mask[room:], trace.logprobs[room:]
    return True


def _after_model_step(trace: Trace, step_text: str, tokenizer, settings: RolloutSettings,
                      builder: ContextBuilder) -> None:
    """Decide how the episode goes on after a model step whose text is `step_text`."""
    if _cut_to(trace, settings.max_seq_len):
        return trace.end(truncation_reason="max_seq_len")
    if trace.finish_reason == "abort":
        trace.metadata["aborted"] = True
        return trace.end()
    if trace.finish_reason == "length" and settings.length_is_parse_failure:
        trace.metadata["parse_failure"] = "length"
        return trace.end(terminated=True)
    env = trace.episode.step(step_text)
    if env.terminated:
        return trace.end(terminated=True)
    if env.truncated:
        return trace.end(truncation_reason="env")
    if trace.steps >= settings.max_steps:
        return trace.end(truncation_reason="max_steps")
    observation = tokenizer(env.observation, add_special_tokens=False)["input_ids"] if env.observation else []
    before = trace.context
    after = builder(trace, observation)
    check_append_only(before, after, f"episode {trace.prompt.prompt_id}#{trace.group_index} step {trace.steps}")
    appended = after[len(before):]
    trace.response += appended
    trace.mask += [0] * len(appended)
    trace.logprobs += [0.0] * len(appended)
    if _cut_to(trace, settings.max_seq_len) or len(trace.context) >= settings.max_seq_len:
        trace.end(truncation_reason="max_seq_len")


def run_episodes(engine: Engine, task: Task, tokenizer, requests: Sequence[tuple[Prompt, int]],
                 settings: RolloutSettings, *, seed: int, builder: ContextBuilder = append_observation,
                 rewards: RewardScorer | None = None) -> list[Sample]:
    """Play one episode per (prompt, group_index), all live episodes batched per model step;
    score them with `rewards` (default: the task's reward inline, in this thread)."""
    stops = stop_token_ids(task, tokenizer)
    distinct = {p.prompt_id: p for p, _ in requests}
    encoded = {pid: prompt_token_ids(tokenizer, p) for pid, p in distinct.items()}  # once a prompt, not once a sample
    traces = [Trace(prompt=p, group_index=i, prompt_tokens=list(encoded[p.prompt_id]),
                    episode=task.new_episode(p), weight_version=engine.weight_version) for p, i in requests]
    for t in traces:
        if len(t.prompt_tokens) >= settings.max_seq_len:
            raise ValueError(f"prompt {t.prompt.prompt_id}: {len(t.prompt_tokens)} tokens leave no room "
                             f"under max_seq_len {settings.max_seq_len}")
    for step in range(settings.max_steps):
        live = [t for t in traces if not t.done]
        if not live:
            break
        version = engine.weight_version
        seeds = [request_seed(seed, t.prompt.prompt_id, t.group_index, step) for t in live]
        outs = engine.generate([t.context for t in live], n=1, max_new_tokens=settings.max_new_tokens,
                               temperature=settings.temperature, seeds=seeds, stop_token_ids=stops)
        for t, (c,) in zip(live, outs):
            produced_by = c.weight_version if c.weight_version is not None else version
            t.weight_version = min(t.weight_version, produced_by)
            t.steps += 1
            t.finish_reason = c.finish_reason
            t.response += c.tokens
            t.mask += [1] * len(c.tokens)
            t.logprobs += c.logprobs
            step_text = tokenizer.decode(c.tokens, skip_special_tokens=True)
            if t.steps == 1:
                t.first_step_text = (len(t.response), step_text)
            _after_model_step(t, step_text, tokenizer, settings, builder)
    samples = _to_samples(traces, tokenizer, settings, rewards or InlineRewards(task), seed)
    endings = Counter(s.truncation_reason or ("parse_failure" if s.metadata.get("parse_failure") else
                                              "aborted" if s.metadata.get("aborted") else "terminated")
                      for s in samples)
    log.debug("rollout_episodes", task=task.name, episodes=len(samples), endings=dict(endings))
    return samples


def _response_text(trace: Trace, tokenizer) -> str:
    """The whole response's text; a one-step episode whose response is still that step's
    tokens (nothing cut, no observation appended) already has it, and decoding again cost
    ~6 % of a rollout on the demo model (bench_grpo --vs-bare)."""
    if trace.steps == 1 and trace.first_step_text is not None and trace.first_step_text[0] == len(trace.response):
        return trace.first_step_text[1]
    return tokenizer.decode(trace.response, skip_special_tokens=True)


def _to_samples(traces: Sequence[Trace], tokenizer, settings: RolloutSettings, rewards: RewardScorer,
                seed: int) -> list[Sample]:
    """Samples of finished traces: the truncation rules fix some rewards, the scorer the rest."""
    texts = [_response_text(t, tokenizer) for t in traces]
    rules = [reward_rule(t.mask, t.truncation_reason, t.metadata, settings) for t in traces]
    pending = [i for i, (fixed, _, _) in enumerate(rules) if fixed is None]
    scored = dict(zip(pending, rewards.score([(traces[i].prompt, texts[i]) for i in pending]))) if pending else {}
    samples = []
    for i, (t, text, (fixed, mask, extra)) in enumerate(zip(traces, texts, rules)):
        reward = fixed
        if i in scored:
            reward = scored[i].value
            if scored[i].failure is not None:
                extra = extra | {"reward_failure": scored[i].failure, "reward_detail": scored[i].detail}
        samples.append(Sample(
            prompt_id=t.prompt.prompt_id, group_index=t.group_index, prompt_tokens=t.prompt_tokens,
            response_tokens=t.response, loss_mask=mask, rollout_logprobs=t.logprobs,
            reward=0.0 if reward is None else reward, weight_version=t.weight_version,
            finish_reason=t.finish_reason, terminated=t.terminated, truncated=t.truncation_reason is not None,
            truncation_reason=t.truncation_reason,
            metadata=t.metadata | extra | {"steps": t.steps, "text": text, "sampling_seed": seed}))
    return samples
