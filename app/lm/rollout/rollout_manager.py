"""The rollout manager: turns prompts into whole, useful, fresh groups, and counts every group
it drops by reason. Both the online loop (rollout_sources.GeneratedGroups: `next_batch`) and
the mesh's self-play (batches.rollout_batch: `collect`) go through it, so the same filters run
in both.

Per round it asks the producer for the missing completions of the partial groups it carries
plus full groups for new prompts, then puts the returned samples together by prompt (never by
arrival order). A group is complete when all `group_size` indices are in; complete groups go
through the filter (groups.filter_reason: a failed reward, an overlong sample under
`overlong_group: drop_group`, equal rewards under `zero_variance: drop`); the survivors queue,
extras carry to the next batch. Partial groups (aborted completions are asked for again) and
carried groups keep the weight version of their oldest sample and are dropped ("stale") once
older than `max_staleness` versions.

`next_batch` over-samples: it asks for `oversample` times the groups the batch still needs.
`collect` plays exactly the prompts it is given (a self-play batch draws its over-sampled
prompt list itself, so a batch stays a pure function of its number). When `max_empty_rounds`
rounds in a row keep nothing, `FilterStarvationError` says why, rather than spinning forever;
except in `next_batch` when equal rewards were the only reason (a task solved, or not yet
learnable, at this weight version): then the batch is those groups as they are (their
advantages are zero, as under `zero_variance: keep`), counted (`zero_variance_fallback`) and
logged, so dynamic sampling never stops a run that merely has no signal for a while.

Each complete group gets a uid from the manager's seed, the round that completed it and its
prompt. Given `consumed` (the trainer's record of uids trained, app/lm/train/consumed.py), a
group already trained is dropped ("consumed"): a run resumed from a checkpoint replays its
rounds with the same seeds, and what it trained after that checkpoint is not trained again.
Rounds that lost groups only to that do not count towards `max_empty_rounds`.

All of it is plain state (`state_dict` / `load_state_dict`, JSON-able), so a resumed run
draws the same prompts with the same seeds.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter
from collections.abc import Container, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from app.lm.rollout.groups import GroupRequest, Producer, filter_reason, make_group
from app.lm.samples import Group, Sample
from app.lm.tasks import Prompt

log = structlog.get_logger(__name__)


class FilterStarvationError(RuntimeError):
    """Round after round, nothing passed the filter: the batch can never be filled."""


class PromptSource(Protocol):
    """Where new prompts come from, resumable (app.lm.data_buffer.DataBuffer is one)."""

    def next_batch(self, n: int) -> list[Prompt]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ManagerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_groups: int = Field(ge=1)          # complete groups per training batch
    group_size: int = Field(ge=2)            # completions per prompt
    oversample: float = Field(1.5, ge=1.0)   # prompts asked per group still needed
    max_staleness: int = Field(1, ge=0)      # versions a carried group may lag behind
    max_empty_rounds: int = Field(8, ge=1)   # rounds in a row that keep nothing -> error
    min_reward_std: float = Field(1e-6, ge=0.0)
    zero_variance: Literal["keep", "drop"] = "drop"


@dataclass(frozen=True)
class Drop:
    prompt_id: str
    reason: str
    weight_version: int


@dataclass(frozen=True)
class Collected:
    kept: list[Group]
    dropped: list[Drop]


class RolloutManager:
    def __init__(self, producer: Producer, source: PromptSource | None, settings: ManagerSettings,
                 seed: int = 0, consumed: Container[str] | None = None) -> None:
        self.producer, self.source, self.settings, self.seed = producer, source, settings, seed
        self.consumed = consumed
        self.round = 0
        self.pending: dict[str, tuple[Prompt, dict[int, Sample]]] = {}   # partial groups
        self.ready: list[Group] = []                                     # filtered, carried
        self.stats: Counter[str] = Counter()
        self.drops: list[Drop] = []                                      # since the caller last took them
        self.equal: list[Group] = []  # this next_batch call's newest equal-reward groups (at most batch_groups)

    def dropped(self) -> dict[str, int]:
        """Groups dropped so far, by reason."""
        return {k.removeprefix("dropped_"): v for k, v in self.stats.items() if k.startswith("dropped_")}

    def take_drops(self) -> list[Drop]:
        drops, self.drops = self.drops, []
        return drops

    # -- the online loop --------------------------------------------------------------------
    def next_batch(self, weight_version: int) -> list[Group]:
        """`batch_groups` whole, filtered groups no older than `max_staleness` versions."""
        if self.source is None:
            raise RuntimeError("next_batch needs a prompt source")
        empty_rounds = 0
        round_reasons: Counter[str] = Counter()
        self.equal = []
        while True:
            self._drop_stale(weight_version)
            self._drop_consumed()
            if len(self.ready) >= self.settings.batch_groups:
                batch, self.ready = self.ready[: self.settings.batch_groups], self.ready[self.settings.batch_groups:]
                return batch
            need = self.settings.batch_groups - len(self.ready)
            wanted = max(0, math.ceil(need * self.settings.oversample) - len(self.pending))
            kept, reasons = self._round(self.source.next_batch(wanted))
            round_reasons += reasons
            replayed = bool(reasons) and set(reasons) == {"consumed"}  # a resumed run's replay: not starvation
            empty_rounds = 0 if kept or replayed else empty_rounds + 1
            if empty_rounds >= self.settings.max_empty_rounds:
                if set(round_reasons) == {"zero_variance"} and len(self.ready) + len(self.equal) >= \
                        self.settings.batch_groups:
                    return self._no_signal_batch(weight_version, empty_rounds)
                raise FilterStarvationError(
                    f"rollout filter kept no group in {empty_rounds} rounds in a row "
                    f"(needed {self.settings.batch_groups - len(self.ready)} more); rejected: "
                    f"{dict(round_reasons) or 'nothing completed'}; totals {dict(self.stats)}")

    def _no_signal_batch(self, weight_version: int, rounds: int) -> list[Group]:
        need = self.settings.batch_groups - len(self.ready)
        batch, self.ready = self.ready + self.equal[-need:] if need > 0 else self.ready, []
        self.equal = []
        self.stats["zero_variance_fallback"] += 1
        log.warning("rollout_no_signal", weight_version=weight_version, rounds=rounds,
                    why="every group had equal rewards: trained as they are (zero advantages)")
        return batch[: self.settings.batch_groups]

    def offer(self, groups: Sequence[Group], weight_version: int) -> int:
        """Whole groups made elsewhere (rollout workers on other nodes: app/lm/train/remote_groups.py)
        join the queue ahead of what this manager would play, through the same filters and the
        consumed record; the staleness bound against `weight_version` applies to them as to
        carried groups (carried groups past it are dropped first, so a fresh group of a prompt
        they hold is not turned away). Returns how many joined."""
        self._drop_stale(weight_version)
        self._drop_consumed()
        joined = 0
        in_flight = set(self.pending) | {g.prompt_id for g in self.ready}
        for group in groups:
            reason = "consumed" if self.consumed is not None and group.uid in self.consumed else \
                "in_flight" if group.prompt_id in in_flight else \
                "stale" if group.oldest_version < weight_version - self.settings.max_staleness else \
                filter_reason(group, self.settings.zero_variance, self.settings.min_reward_std)
            if reason is None:
                self.ready.append(group)
                in_flight.add(group.prompt_id)
                joined += 1
            elif reason == "in_flight":  # the same prompt twice in one batch would merge two groups
                self.stats["skipped_in_flight"] += 1
            else:
                self._drop(group.prompt_id, reason, group.oldest_version)
        self.stats["offered_groups"] += joined
        return joined

    # -- self-play ----------------------------------------------------------------------------
    def collect(self, prompts: Sequence[Prompt], weight_version: int) -> Collected:
        """Each prompt's group, played to completion and filtered: the kept groups and the
        dropped ones with their reasons (nothing carries over: the caller stores both)."""
        new, rounds = list(prompts), 0
        while new or self.pending:
            if rounds >= self.settings.max_empty_rounds:
                raise FilterStarvationError(f"{len(self.pending)} groups still incomplete after {rounds} "
                                            f"rounds (every completion aborted?): {sorted(self.pending)[:5]}")
            self._round(new)
            new, rounds = [], rounds + 1
            self._drop_stale(weight_version)
        kept_groups, self.ready = self.ready, []
        return Collected(kept_groups, self.take_drops())

    # -- shared -------------------------------------------------------------------------------
    def _round(self, new_prompts: Sequence[Prompt]) -> tuple[int, Counter[str]]:
        s = self.settings
        requests = [GroupRequest(p, tuple(i for i in range(s.group_size) if i not in have))
                    for p, have in self.pending.values()]
        in_flight = set(self.pending) | {g.prompt_id for g in self.ready}
        for prompt in new_prompts:
            if prompt.prompt_id in in_flight:
                self.stats["skipped_in_flight"] += 1   # the same prompt twice would merge two groups
                continue
            in_flight.add(prompt.prompt_id)
            self.pending[prompt.prompt_id] = (prompt, {})
            requests.append(GroupRequest(prompt, tuple(range(s.group_size))))
        samples = self.producer(requests, self.seed * 1_000_003 + self.round) if requests else []
        self.round += 1
        self._merge(requests, samples)
        return self._complete_groups()

    def _merge(self, requests: Sequence[GroupRequest], samples: Sequence[Sample]) -> None:
        wanted = {r.prompt.prompt_id: set(r.group_indices) for r in requests}
        for sample in samples:
            if sample.group_index not in wanted.get(sample.prompt_id, ()):
                raise ValueError(f"producer returned completion {sample.group_index} of prompt "
                                 f"{sample.prompt_id}, which was not requested")
            wanted[sample.prompt_id].discard(sample.group_index)
            if sample.metadata.get("aborted"):
                self.stats["aborted_samples"] += 1   # asked for again next round
                continue
            self.pending[sample.prompt_id][1][sample.group_index] = sample

    def _complete_groups(self) -> tuple[int, Counter[str]]:
        kept, reasons = 0, Counter()
        for prompt_id, (_, have) in list(self.pending.items()):
            if len(have) < self.settings.group_size:
                continue
            del self.pending[prompt_id]
            group = make_group(prompt_id, [have[i] for i in sorted(have)], self._uid(prompt_id))
            reason = "consumed" if self.consumed is not None and group.uid in self.consumed else \
                filter_reason(group, self.settings.zero_variance, self.settings.min_reward_std)
            if reason is None:
                self.ready.append(group)
                kept += 1
            else:
                reasons[reason] += 1
                self._drop(prompt_id, reason, group.oldest_version)
                if reason == "zero_variance":
                    self.equal = [*self.equal, group][-self.settings.batch_groups:]
        self.stats["kept_groups"] += kept
        self.stats["partial_groups_carried"] += len(self.pending)
        return kept, reasons

    def _drop_consumed(self) -> None:
        """Carried groups restored from a checkpoint that the run trained after it."""
        if self.consumed is None:
            return
        gone = [g for g in self.ready if g.uid in self.consumed]
        if gone:
            self.ready = [g for g in self.ready if g.uid not in self.consumed]
            for g in gone:
                self._drop(g.prompt_id, "consumed", g.oldest_version)

    def _uid(self, prompt_id: str) -> str:
        """32 hex digits of (seed, the round that completed the group, prompt): one prompt is
        never in flight twice, so no two groups of a manager share one."""
        return hashlib.sha256(f"{self.seed}\0{self.round - 1}\0{prompt_id}".encode()).hexdigest()[:32]

    def _drop(self, prompt_id: str, reason: str, version: int) -> None:
        self.stats[f"dropped_{reason}"] += 1
        self.drops.append(Drop(prompt_id, reason, version))

    def _drop_stale(self, weight_version: int) -> None:
        bound = weight_version - self.settings.max_staleness
        stale_ready = [g for g in self.ready if g.oldest_version < bound]
        stale_pending = {pid: min(x.weight_version for x in have.values())
                         for pid, (_, have) in self.pending.items()
                         if have and min(x.weight_version for x in have.values()) < bound}
        if stale_ready or stale_pending:
            self.ready = [g for g in self.ready if g.oldest_version >= bound]
            for g in stale_ready:
                self._drop(g.prompt_id, "stale", g.oldest_version)
            for pid, version in stale_pending.items():
                del self.pending[pid]
                self._drop(pid, "stale", version)
            log.info("rollout_stale_dropped", ready=len(stale_ready), partial=len(stale_pending),
                     weight_version=weight_version, max_staleness=self.settings.max_staleness)

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "stats": dict(self.stats),
                "source": self.source.state_dict() if self.source is not None else None,
                "ready": [g.to_dict() for g in self.ready],
                "pending": [{"prompt": asdict(p), "samples": [x.to_dict() for x in have.values()]}
                            for p, have in self.pending.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.stats = Counter(state["stats"])
        if self.source is not None:
            self.source.load_state_dict(state["source"])
        self.ready = [Group.from_dict(g) for g in state["ready"]]
        self.pending = {}
        for item in state["pending"]:
            prompt = Prompt(**item["prompt"])
            samples = [Sample.from_dict(x) for x in item["samples"]]
            self.pending[prompt.prompt_id] = (prompt, {x.group_index: x for x in samples})
