"""Self-play of the language-model workload: play a batch of groups with the current weights
through the rollout manager (its filters: failed rewards, overlong groups, zero variance,
staleness) and store each kept group in the rollout store, each dropped one as a tombstone
with its reason.

A batch is named by (node, model, seed): the uid of each group is a hash of those and its
prompt id, so running the same batch again (a node restarted after a kill -9 mid-batch)
neither plays the groups already settled (stored or dropped) nor stores any twice; only the
missing ones are played. Each group is one transaction (app/db/rollout_store.py), so what a
killed writer leaves behind is a prefix of whole groups. Sampling seeds derive from the
batch's name too, so two nodes never draw the same completions for the same prompt.

Which prompts a batch draws is a pure function of the prompt pool, the seed and the batch
number (an epoch is a permutation from `Random(seed + epoch)`), so a batch can be replayed;
it draws `oversample` times the groups it means to keep, as the filter will drop some.
"""

from __future__ import annotations

import hashlib
import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from app.db.rollout_store import RolloutGroupRecord, RolloutSampleRecord, RolloutStore
from app.lm.reward_pool import RewardScorer
from app.lm.rollout.engine import Engine
from app.lm.rollout.groups import engine_producer
from app.lm.rollout.rollout_manager import ManagerSettings, RolloutManager
from app.lm.samples import Group, Sample
from app.lm.tasks import Prompt, Task
from app.lm.truncation import RolloutSettings
from app.log import get_logger

log = get_logger(__name__)


def group_uid(node_id: str, model_id: str, seed: int, prompt_id: str) -> str:
    """32 hex digits: the same batch's group of a prompt always gets the same uid."""
    return hashlib.sha256(f"{node_id}\0{model_id}\0{seed}\0{prompt_id}".encode()).hexdigest()[:32]


def batch_prompts(pool: Sequence[Prompt], seed: int, batch: int, size: int) -> list[Prompt]:
    """Prompts of batch number `batch`: consecutive slices of epoch permutations of `pool`.
    Distinct prompts within a batch (groups are keyed by prompt), so `size` <= len(pool)."""
    if not 1 <= size <= len(pool):
        raise ValueError(f"a batch of {size} distinct prompts needs 1 <= size <= {len(pool)} (the pool)")
    start = batch * size
    out: list[Prompt] = []
    seen: set[str] = set()
    position = start
    while len(out) < size:
        epoch, offset = divmod(position, len(pool))
        order = list(range(len(pool)))
        random.Random(seed + epoch).shuffle(order)
        prompt = pool[order[offset]]
        if prompt.prompt_id not in seen:  # an epoch boundary inside the batch may repeat one
            seen.add(prompt.prompt_id)
            out.append(prompt)
        position += 1
    return out


def to_record(group: Group, *, uid: str, node_id: str, task: str, model_sha256: str | None,
              created_at: float) -> RolloutGroupRecord:
    prompt_tokens = group.samples[0].prompt_tokens
    if any(s.prompt_tokens != prompt_tokens for s in group.samples):
        raise ValueError(f"group {group.prompt_id}: samples of one prompt with different prompt tokens")
    return RolloutGroupRecord(
        uid=uid, node_id=node_id, task=task, prompt_id=group.prompt_id, prompt_tokens=list(prompt_tokens),
        weight_version=group.oldest_version, model_sha256=model_sha256, created_at=created_at,
        samples=[RolloutSampleRecord(
            group_index=s.group_index, response_tokens=list(s.response_tokens), loss_mask=list(s.loss_mask),
            rollout_logprobs=list(s.rollout_logprobs), reward=s.reward, weight_version=s.weight_version,
            finish_reason=s.finish_reason, terminated=s.terminated, truncated=s.truncated,
            truncation_reason=s.truncation_reason, metadata=dict(s.metadata)) for s in group.samples])


def to_group(record: RolloutGroupRecord) -> Group:
    """Back to app/lm's types (for export and GRPO): the same samples, validated again."""
    samples = [Sample(prompt_id=record.prompt_id, group_index=s.group_index, prompt_tokens=list(record.prompt_tokens),
                      response_tokens=list(s.response_tokens), loss_mask=list(s.loss_mask),
                      rollout_logprobs=list(s.rollout_logprobs), reward=s.reward, weight_version=s.weight_version,
                      finish_reason=s.finish_reason, terminated=s.terminated, truncated=s.truncated,
                      truncation_reason=s.truncation_reason, metadata=dict(s.metadata)) for s in record.samples]
    return Group(prompt_id=record.prompt_id, samples=samples, weight_version=record.weight_version)


@dataclass(frozen=True)
class BatchResult:
    stored: int  # groups this call stored
    already: int  # groups of this batch found settled before (an earlier, interrupted run)
    dropped: dict[str, int]  # groups this call dropped, by reason
    reward_mean: float | None  # over the groups stored by this call
    truncated_samples: int
    seconds: float


def rollout_batch(engine: Engine, task: Task, tokenizer, prompts: Sequence[Prompt], settings: RolloutSettings,
                  store: RolloutStore, *, node_id: str, model_id: str, seed: int, model_sha256: str | None = None,
                  manager: ManagerSettings | None = None, rewards: RewardScorer | None = None,
                  current_version: int | None = None) -> BatchResult:
    """Play and store one group per prompt with `engine`'s current weights.

    `model_id` names the weights (their sha256 when known) so a batch with new weights gets
    new uids; `seed` names the batch. Settled groups are skipped before playing. `manager`
    holds the filter settings (default: drop only what no setting can keep); `current_version`
    is the newest weight version, the staleness bound's reference (default: the engine's)."""
    started = time.perf_counter()
    uids = {p.prompt_id: group_uid(node_id, model_id, seed, p.prompt_id) for p in prompts}
    if len(uids) != len(prompts):
        raise ValueError("a batch's prompts must have distinct prompt ids")
    done = store.settled(list(uids.values()))
    todo = [p for p in prompts if uids[p.prompt_id] not in done]
    stored, rewards_seen, truncated, dropped = 0, [], 0, Counter()
    if todo:
        cfg = manager or ManagerSettings(batch_groups=len(todo), group_size=settings.n, zero_variance="keep")
        draw_seed = int(group_uid(node_id, model_id, seed, "")[:8], 16)
        played = RolloutManager(engine_producer(engine, task, tokenizer, settings, rewards=rewards), None, cfg,
                                seed=draw_seed).collect(todo, engine.weight_version if current_version is None
                                                        else current_version)
        now = time.time()
        for group in played.kept:
            record = to_record(group, uid=uids[group.prompt_id], node_id=node_id, task=task.name,
                               model_sha256=model_sha256, created_at=now)
            stored += store.add_group(record)
            rewards_seen += record.rewards
            truncated += sum(s.truncated for s in record.samples)
        for drop in played.dropped:
            if store.add_dropped(uids[drop.prompt_id], node_id, drop.prompt_id, drop.reason, drop.weight_version, now):
                dropped[drop.reason] += 1
    result = BatchResult(stored=stored, already=len(done), dropped=dict(dropped),
                         reward_mean=sum(rewards_seen) / len(rewards_seen) if rewards_seen else None,
                         truncated_samples=truncated, seconds=time.perf_counter() - started)
    log.info("lm_rollout_batch", node=node_id, seed=seed, stored=stored, already=len(done), dropped=dict(dropped),
             reward_mean=result.reward_mean, weight_version=engine.weight_version, seconds=round(result.seconds, 3))
    return result
