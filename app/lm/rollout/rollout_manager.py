"""The rollout manager: fills each training batch with whole, useful, fresh groups.

Per round it asks the producer for the missing completions of the partial groups it carries
plus full groups for new prompts (over-sampled: `oversample` times what the batch still
needs), then puts the returned samples together by prompt (never by arrival order). A group
is complete when all `group_size` indices are in; complete groups go through the filter
(zero-variance groups give GRPO no signal and are dropped); the survivors queue for the batch,
and extras carry to the next batch. Partial groups (aborted or unfinished completions) and
carried groups keep the weight version of their oldest sample and are dropped once older than
`max_staleness` versions. When `max_empty_rounds` rounds in a row keep nothing, it raises
`FilterStarvationError` with the counts of why, rather than spinning forever.

All of it is plain state (`state_dict` / `load_state_dict`, JSON-able), so a resumed run
draws the same prompts with the same seeds.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from app.lm.rollout.groups import GroupRequest, Producer, filter_reason, make_group
from app.lm.samples import Group, Sample
from app.lm.tasks import Prompt

log = structlog.get_logger(__name__)


class FilterStarvationError(RuntimeError):
    """Round after round, nothing passed the filter: the batch can never be filled."""


class PromptSource(Protocol):
    def take(self, k: int) -> list[Prompt]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CyclingPrompts:
    """Prompts in epochs, each epoch a permutation drawn from `Random(seed + epoch)`."""

    def __init__(self, prompts: Sequence[Prompt], seed: int) -> None:
        if not prompts:
            raise ValueError("CyclingPrompts needs at least one prompt")
        self.prompts, self.seed, self.epoch, self.offset = list(prompts), seed, 0, 0

    def _order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def take(self, k: int) -> list[Prompt]:
        out: list[Prompt] = []
        while len(out) < k:
            order = self._order()
            step = min(k - len(out), len(order) - self.offset)
            out += [self.prompts[i] for i in order[self.offset:self.offset + step]]
            self.offset += step
            if self.offset == len(order):
                self.epoch, self.offset = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])


class ManagerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    batch_groups: int = Field(ge=1)          # complete groups per training batch
    group_size: int = Field(ge=2)            # completions per prompt
    oversample: float = Field(1.5, ge=1.0)   # prompts asked per group still needed
    max_staleness: int = Field(1, ge=0)      # versions a carried group may lag behind
    max_empty_rounds: int = Field(8, ge=1)   # rounds in a row that keep nothing -> error
    min_reward_std: float = Field(1e-6, ge=0.0)


class RolloutManager:
    def __init__(self, producer: Producer, source: PromptSource, settings: ManagerSettings, seed: int = 0) -> None:
        self.producer, self.source, self.settings, self.seed = producer, source, settings, seed
        self.round = 0
        self.pending: dict[str, tuple[Prompt, dict[int, Sample]]] = {}   # partial groups
        self.ready: list[Group] = []                                     # filtered, carried
        self.stats: Counter[str] = Counter()

    def next_batch(self, weight_version: int) -> list[Group]:
        """`batch_groups` whole, filtered groups no older than `max_staleness` versions."""
        empty_rounds = 0
        round_reasons: Counter[str] = Counter()
        while True:
            self._drop_stale(weight_version)
            if len(self.ready) >= self.settings.batch_groups:
                batch, self.ready = self.ready[: self.settings.batch_groups], self.ready[self.settings.batch_groups:]
                return batch
            kept, reasons = self._one_round()
            round_reasons += reasons
            empty_rounds = 0 if kept else empty_rounds + 1
            if empty_rounds >= self.settings.max_empty_rounds:
                raise FilterStarvationError(
                    f"rollout filter kept no group in {empty_rounds} rounds in a row "
                    f"(needed {self.settings.batch_groups - len(self.ready)} more); rejected: "
                    f"{dict(round_reasons) or 'nothing completed'}; totals {dict(self.stats)}")

    def _one_round(self) -> tuple[int, Counter[str]]:
        s = self.settings
        need = s.batch_groups - len(self.ready)
        requests = [GroupRequest(p, tuple(i for i in range(s.group_size) if i not in have))
                    for p, have in self.pending.values()]
        in_flight = set(self.pending) | {g.prompt_id for g in self.ready}
        for prompt in self.source.take(max(0, math.ceil(need * s.oversample) - len(requests))):
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
            group = make_group(prompt_id, [have[i] for i in sorted(have)])
            reason = filter_reason(group, self.settings.min_reward_std)
            if reason is None:
                self.ready.append(group)
                kept += 1
            else:
                reasons[reason] += 1
                self.stats[f"filtered_{reason}"] += 1
        self.stats["kept_groups"] += kept
        self.stats["partial_groups_carried"] += len(self.pending)
        return kept, reasons

    def _drop_stale(self, weight_version: int) -> None:
        bound = weight_version - self.settings.max_staleness
        stale_ready = [g for g in self.ready if g.oldest_version < bound]
        stale_pending = [pid for pid, (_, have) in self.pending.items()
                         if have and min(x.weight_version for x in have.values()) < bound]
        if stale_ready or stale_pending:
            self.ready = [g for g in self.ready if g.oldest_version >= bound]
            for pid in stale_pending:
                del self.pending[pid]
            self.stats["stale_groups_dropped"] += len(stale_ready) + len(stale_pending)
            log.info("rollout_stale_dropped", ready=len(stale_ready), partial=len(stale_pending),
                     weight_version=weight_version, max_staleness=self.settings.max_staleness)

    def state_dict(self) -> dict[str, Any]:
        return {"round": self.round, "stats": dict(self.stats), "source": self.source.state_dict(),
                "ready": [g.to_dict() for g in self.ready],
                "pending": [{"prompt": asdict(p), "samples": [x.to_dict() for x in have.values()]}
                            for p, have in self.pending.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.round = int(state["round"])
        self.stats = Counter(state["stats"])
        self.source.load_state_dict(state["source"])
        self.ready = [Group.from_dict(g) for g in state["ready"]]
        self.pending = {}
        for item in state["pending"]:
            prompt = Prompt(**item["prompt"])
            samples = [Sample.from_dict(x) for x in item["samples"]]
            self.pending[prompt.prompt_id] = (prompt, {x.group_index: x for x in samples})
