"""Where a GRPO step's groups come from: the one difference between the online and the offline run.

    StoredGroups     groups generated earlier and exported (the mesh's generations): every rank
                     draws the same global batch from its DataBuffer and trains on its share of
                     the rows; the ratio is against the log-probs the engine stored with them
                     (the mesh's self-play filtered them already, app/lm/rollout/batches.py).
    GeneratedGroups  groups generated now by an engine holding the trainer's weights
                     (scripts/sft_rl.py), through the rollout manager: over-sampling, the
                     filters (failed rewards, overlong groups, zero variance) and staleness,
                     each dropped group counted by reason in the step's stats. Each rank plays
                     its own stream of prompts (a group stays whole on one rank, so advantages
                     need no exchange); only the token count is summed across ranks. After the
                     optimizer step the engine gets the new weights (weight_sync.py), with the
                     step as their version (an HTTP server beside several ranks: rank 0 loads
                     the gathered weights, the others generate once it confirmed them); an engine whose sync failed is synced again before
                     it generates, and the run stops if that fails too: nothing it would
                     generate is labelled with weights it did not load. Given a consumed
                     record (consumed.py), each step's group uids are appended to it, durably,
                     before the step trains, and the manager drops a group already in it: a
                     run resumed after a kill -9 never trains a group twice. In a run the
                     node launched, each step's weights are also published for rollout
                     workers on other nodes (policy_publish.py), and the groups they made from
                     them are offered to the manager first (remote_groups.py): the same
                     filters, staleness bound and consumed record, counted as `remote_groups`.

Both hand the run (sft_grpo.py) a `StepBatch`: this rank's rows, the global batch's trained-
token count (every loss is divided by it, so the step is the same at any world size), the row
count of the fullest rank (so every rank runs as many micro-batches and the collectives pair
up) and the micro-batch size. Their `buffer` (what is drawn next; for GeneratedGroups the
manager, carried groups included) is checkpointed with the run.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import structlog

from app.config.lm import LMRolloutSettings
from app.lm.data_buffer import DataBuffer
from app.lm.reward_pool import InlineRewards, RewardScorer
from app.lm.rollout.engine import Engine, EngineOutOfService
from app.lm.rollout.groups import DROP_REASONS, engine_producer
from app.lm.rollout.rollout_manager import ManagerSettings, RolloutManager
from app.lm.rollout.weight_sync import WeightSyncError, start_engines_blocking, sync_engines_blocking
from app.lm.samples import Group
from app.lm.tasks import Prompt, Task
from app.lm.train.backend import TrainingBackend
from app.lm.train.batching import TrainSequence, sequences_from_samples
from app.lm.train.consumed import ConsumedGroups
from app.lm.train.grpo import group_advantages
from app.lm.train.policy_publish import PolicyPublisher
from app.lm.train.remote_groups import RemoteGroups
from app.lm.train.weight_publish import WeightPublisher
from app.lm.truncation import RolloutSettings
from app.shared.process_group import rank_share, take_share

log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class StepBatch:
    rows: list[TrainSequence]  # this rank's
    tokens: float  # trained tokens of the whole global batch (the loss normalizer)
    most_rows: int  # rows of the rank with the most
    micro: int  # rows per forward/backward
    stats: dict[str, Any] = field(default_factory=dict)


class Resumable(Protocol):
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class RolloutSource(Protocol):
    buffer: Resumable  # checkpointed with the run: a resumed run draws what an unbroken one would
    # whether a step's stats carry its wall times (rollout_s, train_s, sync_s): not where they
    # must be a pure function of the data (a resumed generation's result equals an unbroken one's)
    timed: bool

    def begin(self, backend: TrainingBackend, step: int) -> None: ...  # before the first step of a (resumed) phase
    def batch(self, backend: TrainingBackend, step: int) -> StepBatch: ...
    def trained(self, backend: TrainingBackend, step: int) -> None: ...  # after the optimizer step


def all_reduce_sum(backend: TrainingBackend, values: list[float]) -> list[float]:
    reducer = getattr(backend, "env", None)
    return reducer.all_reduce_floats(values) if reducer is not None else list(values)  # one rank: the values


@dataclass
class StoredGroups:
    """Offline: `groups_per_step` groups a step from an exported dataset, in the buffer's order."""

    buffer: DataBuffer[Group]
    groups_per_step: int
    micro_batches: int = 1  # forward/backward passes a step, split evenly over the rank's rows
    scale_by_std: bool = True
    eps: float = 1e-6
    # "drop": groups of equal rewards (no signal) are skipped and the step drawn on, at most
    # `draws` x groups_per_step groups; a step that finds none with signal trains the equal
    # ones it drew (zero advantages). Self-play stores every complete group (the mesh's filter
    # keeps them), so this is where the stored path applies the same rule as the online one.
    zero_variance: str = "keep"
    draws: int = 4
    timed: ClassVar[bool] = False

    def begin(self, backend: TrainingBackend, step: int) -> None:
        """The groups carry their own log-probs: nothing to prepare."""

    def _draw(self) -> tuple[list[Group], int]:
        if self.zero_variance != "drop":
            return self.buffer.next_batch(self.groups_per_step), 0
        kept, equal = [], []
        for _ in range(self.draws * self.groups_per_step):
            group = self.buffer.next_batch(1)[0]
            (equal if max(group.rewards) - min(group.rewards) <= self.eps else kept).append(group)
            if len(kept) == self.groups_per_step:
                break
        return (kept or equal[-self.groups_per_step:]), len(equal)

    def batch(self, backend: TrainingBackend, step: int) -> StepBatch:
        groups, skipped = self._draw()
        samples = [s for g in groups for s in g.samples]
        advs = [a for g in groups for a in group_advantages(g.rewards, self.scale_by_std, self.eps)]
        rows = sequences_from_samples(samples, advs)
        most = rank_share(len(rows), 0, backend.world_size)[1]
        return StepBatch(take_share(rows, backend.rank, backend.world_size), float(sum(r.trained_tokens for r in rows)),
                         most, max(1, -(-most // max(1, self.micro_batches))),
                         {"groups": len(groups), "mean_reward": sum(s.reward for s in samples) / max(len(samples), 1),
                          "skipped_zero_variance": skipped})

    def trained(self, backend: TrainingBackend, step: int) -> None:
        """No engine to update: the groups were generated by an earlier generation's weights."""


_ROLLOUT_DEFAULTS = LMRolloutSettings()


@dataclass(frozen=True)
class LoopFilters:
    """The rollout manager's settings the online loop takes from its configuration; the
    defaults are the config's (`lm.rollout`), one source for the mesh and scripts/sft_rl.py."""

    oversample: float = _ROLLOUT_DEFAULTS.oversample
    zero_variance: str = _ROLLOUT_DEFAULTS.zero_variance
    max_staleness: int = _ROLLOUT_DEFAULTS.max_staleness
    max_empty_rounds: int = 8


class GeneratedGroups:
    """Online: `prompts_per_step` groups a step, played by `engine` through the rollout manager
    from this rank's prompts (`prompts`, every `world_size`-th of the list from `rank`), with
    sampling seeds from `seed` and the manager's round."""

    timed: ClassVar[bool] = True

    def __init__(self, engine: Engine, task: Task, tokenizer: Any, prompts: Sequence[Prompt], *, seed: int,
                 prompts_per_step: int, rollout: RolloutSettings, filters: LoopFilters = LoopFilters(),
                 publish: WeightPublisher | None = None, rewards: RewardScorer | None = None,
                 micro_batch_size: int = 64, scale_by_std: bool = True, shuffle_advantages: bool = False,
                 rank: int = 0, world_size: int = 1, consumed: ConsumedGroups | None = None,
                 policy: PolicyPublisher | None = None, remote: RemoteGroups | None = None) -> None:
        if rollout.n < 2:
            raise ValueError(f"GRPO groups need n >= 2 completions per prompt, got {rollout.n}")
        self.engine, self.task, self.tokenizer, self.seed = engine, task, tokenizer, seed
        self.prompts_per_step, self.rollout = prompts_per_step, rollout
        self.publish, self.rewards = publish, rewards or InlineRewards(task)
        self.micro_batch_size, self.scale_by_std = micro_batch_size, scale_by_std
        self.shuffle_advantages = shuffle_advantages  # control run: advantages permuted across the batch (no credit)
        self.consumed, self.max_staleness = consumed, filters.max_staleness
        # rollout workers on other nodes: the weights each step published for them (rank 0) and
        # the groups they made from them, taken ahead of this engine's own (remote_groups.py)
        self.policy, self.remote = policy, remote
        mine = list(prompts)[rank::world_size]
        self.share = rank_share(prompts_per_step, rank, world_size)[1]
        settings = ManagerSettings(batch_groups=max(1, self.share), group_size=rollout.n,
                                   oversample=filters.oversample, zero_variance=filters.zero_variance,
                                   max_staleness=filters.max_staleness, max_empty_rounds=filters.max_empty_rounds)
        producer = engine_producer(engine, task, tokenizer, rollout, rewards=self.rewards)
        self.manager = RolloutManager(producer, DataBuffer(mine, seed + 1), settings, seed=seed * 1_000_003 + rank,
                                      consumed=consumed)

    @property
    def buffer(self) -> RolloutManager:
        return self.manager

    def _update(self, backend: TrainingBackend, version: int):
        if self.publish is not None:
            return self.publish(version)
        return WeightPublisher(backend.get_weights)(version)

    def _shared(self, backend: TrainingBackend) -> bool:
        """An HTTP engine beside several training ranks: one server for them all."""
        return self.engine.kind != "in_process" and backend.world_size > 1

    def _sync(self, backend: TrainingBackend, version: int) -> None:
        """The engine loads the trainer's weights as `version`; a failure is logged and leaves
        the engine out of service (weight_sync.py). Every rank joins the gather of the whole
        weights (a collective); with one HTTP server beside several ranks, rank 0 alone loads
        them into it (slime's "rank 0 gathers full weights") and every rank learns whether the
        server confirmed the version before any of them generates with it."""
        update = self._update(backend, version)
        if self.policy is not None and backend.rank == 0:
            self.policy(version, update.tensors())  # type: ignore[misc]
        loads = not self._shared(backend) or backend.rank == 0
        if loads:
            try:
                sync_engines_blocking([self.engine], update)
            except WeightSyncError as exc:
                log.error("online_sync_failed", engine=self.engine.name, version=version, error=str(exc))
        if not self._shared(backend):
            return
        confirmed = all_reduce_sum(backend, [1.0 if backend.rank == 0 and self.engine.in_service else 0.0])[0] > 0
        if backend.rank != 0:
            if confirmed:
                self.engine.adopt(version)  # type: ignore[attr-defined]
            else:
                self.engine.take_out_of_service(f"rank 0's load of version {version} failed")  # type: ignore[attr-defined]

    def _needs_sync(self, backend: TrainingBackend) -> bool:
        """This engine is out of service; with a shared server, any rank's is (a collective, so
        every rank then joins the sync together)."""
        local = not self.engine.in_service
        return all_reduce_sum(backend, [float(local)])[0] > 0 if self._shared(backend) else local

    def begin(self, backend: TrainingBackend, step: int) -> None:
        """Start-up checks, then rollouts of the weights that train (version `step`)."""
        start_engines_blocking([self.engine])
        self._sync(backend, step)

    def batch(self, backend: TrainingBackend, step: int) -> StepBatch:
        if self._needs_sync(backend):  # the last sync failed: once more, with the weights that train now
            self._sync(backend, step - 1)
            if not self.engine.in_service:
                raise EngineOutOfService(f"engine {self.engine.name} is out of service and a new sync failed: "
                                         f"{self.engine.last_error}")
        reward_before = self.rewards.seconds
        if self.remote is not None:
            self.manager.offer(self.remote.take(min_version=step - 1 - self.max_staleness), weight_version=step - 1)
        groups = self.manager.next_batch(weight_version=step - 1)
        remote = sum(g.uid in self.remote.uids for g in groups) if self.remote is not None else 0
        if self.consumed is not None:
            self.consumed.record(step, [g.uid for g in groups])
        reward_s = self.rewards.seconds - reward_before
        dropped = Counter(d.reason for d in self.manager.take_drops())
        samples = [s for g in groups for s in g.samples]
        rows = sequences_from_samples(samples, self._advantages(groups, step))
        totals = all_reduce_sum(backend, [
            float(sum(r.trained_tokens for r in rows)), float(sum(s.reward for s in samples)),
            float(sum(len(s.response_tokens) for s in samples)), float(remote),
            *(float(dropped[r]) for r in DROP_REASONS),
            *staleness_histogram(groups, step, self.max_staleness)])
        tokens, reward_sum, generated, remote_sum = totals[:4]
        totals = totals[:3] + totals[4:]
        reasons = len(DROP_REASONS)
        most = rank_share(self.prompts_per_step, 0, backend.world_size)[1] * self.rollout.n
        stats = {"mean_reward": reward_sum / (self.prompts_per_step * self.rollout.n), "generated_tokens": generated,
                 "reward_s": reward_s, "weight_version": self.engine.weight_version, "remote_groups": int(remote_sum),
                 "staleness_groups": [int(n) for n in totals[3 + reasons:]],
                 **{f"dropped_{r}": int(n) for r, n in zip(DROP_REASONS, totals[3:3 + reasons])}}
        return StepBatch(rows, tokens, most, self.micro_batch_size, stats)

    def _advantages(self, groups: Sequence[Group], step: int) -> list[float]:
        advs = [a for g in groups for a in group_advantages(g.rewards, self.scale_by_std)]
        if self.shuffle_advantages:
            random.Random(self.seed * 7919 + step).shuffle(advs)
        return advs

    def trained(self, backend: TrainingBackend, step: int) -> None:
        self._sync(backend, step)


def staleness_histogram(groups: Sequence[Group], step: int, max_staleness: int) -> list[float]:
    """Groups trained at step `step` (the trainer holding version step - 1) by how many versions
    their oldest sample lags: counts for 0 .. max_staleness, then one for anything older (the
    bound broken: always 0). A list of counts, so ranks add theirs."""
    counts = [0.0] * (max_staleness + 2)
    for g in groups:
        counts[min(max(0, step - 1 - g.oldest_version), max_staleness + 1)] += 1
    return counts


def dataset_problem(groups: Sequence[Group], vocab_size: int) -> str | None:
    """Why these groups cannot be trained on by a model of `vocab_size` tokens (None: they can)."""
    if not groups:
        return "holds no groups"
    for group in groups:
        if len(group.samples) < 2:
            return f"group {group.prompt_id} has {len(group.samples)} sample(s): GRPO needs a baseline"
        for s in group.samples:
            tokens = [*s.prompt_tokens, *s.response_tokens]
            if not s.prompt_tokens or any(t < 0 or t >= vocab_size for t in tokens):
                return (f"sample {s.prompt_id}#{s.group_index} has token ids outside the model's "
                        f"vocabulary of {vocab_size} (or an empty prompt)")
    return None


def drawn_mean_reward(groups: Sequence[Group], seed: int, steps: int, per_step: int) -> float:
    """Mean sample reward over every group the run's buffer draws in `steps` steps: a pure
    function of the dataset and the seed, so a resumed run reports what an unbroken one would."""
    buffer = DataBuffer(groups, seed)
    rewards = [r for _ in range(steps) for g in buffer.next_batch(per_step) for r in g.rewards]
    return sum(rewards) / len(rewards) if rewards else 0.0
