"""The rollout manager (item 6): over-sampling, the zero-variance filter (drop or keep), groups
kept whole and keyed by prompt, partial groups carried with their weight version and dropped
when stale, a failed reward dropping its group, every drop counted by reason, a clear error when
nothing passes, a state round trip, and `collect` (self-play's exact prompt list)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from app.atomic_files import atomic_write_json
from app.lm.rollout.engine import InProcessEngine
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.rollout.groups import engine_producer
from app.lm.data_buffer import DataBuffer
from app.lm.rollout.rollout_manager import FilterStarvationError, ManagerSettings, RolloutManager
from app.lm.samples import Sample
from app.lm.train.consumed import ConsumedGroups, ConsumedRecordError
from app.lm.tasks import DigitTask, Prompt
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.truncation import RolloutSettings

pytestmark = pytest.mark.timeout(120)
PROMPTS = [Prompt(f"p{i}", f"copy:{i}=", str(i)) for i in range(20)]


class ScriptedProducer:
    """Returns the requested samples in a shuffled order; rewards and gaps are chosen per prompt."""

    def __init__(self, *, flat: set[str] = frozenset(), hold_back: dict[str, int] | None = None,
                 version: int = 0, failed: dict[str, str] | None = None) -> None:
        self.flat, self.hold_back, self.version = set(flat), dict(hold_back or {}), version
        self.failed = dict(failed or {})  # prompt id -> the reward failure of its completion 0
        self.requests: list[list[tuple[str, tuple[int, ...]]]] = []

    def __call__(self, requests, seed):
        self.requests.append([(r.prompt.prompt_id, r.group_indices) for r in requests])
        out = []
        for r in requests:
            indices = list(r.group_indices)
            if self.hold_back.get(r.prompt.prompt_id):
                self.hold_back[r.prompt.prompt_id] -= 1
                indices = indices[:1]       # only one completion came back this round
            for i in indices:
                reward = 0.5 if r.prompt.prompt_id in self.flat else float((i + seed) % 2)
                failure = self.failed.get(r.prompt.prompt_id) if i == 0 else None
                out.append(Sample(prompt_id=r.prompt.prompt_id, group_index=i, prompt_tokens=[1],
                                  response_tokens=[5, 2], loss_mask=[1, 1], rollout_logprobs=[-1.0, -1.0],
                                  reward=reward, weight_version=self.version, finish_reason="stop",
                                  terminated=True, truncated=False, truncation_reason=None,
                                  metadata={"seed": seed, **({"reward_failure": failure} if failure else {})}))
        random.Random(seed).shuffle(out)    # arrival order says nothing about groups
        return out


def settings(**kw) -> ManagerSettings:
    return ManagerSettings(**({"batch_groups": 4, "group_size": 3, "oversample": 1.5} | kw))


def assert_whole(groups, group_size):
    for g in groups:
        assert [s.group_index for s in g.samples] == list(range(group_size))
        assert {s.prompt_id for s in g.samples} == {g.prompt_id}


def test_oversampling_filter_and_carried_extras():
    producer = ScriptedProducer(flat={"p0", "p1", "p2", "p3", "p4"})
    manager = RolloutManager(producer, DataBuffer(PROMPTS, 0), settings(), seed=0)
    batch = manager.next_batch(weight_version=0)
    assert len(batch) == 4 and len({g.prompt_id for g in batch}) == 4
    assert_whole(batch, 3)
    assert not {g.prompt_id for g in batch} & producer.flat
    assert len(producer.requests[0]) == 6    # ceil(4 * 1.5) prompts asked for 4 groups
    assert manager.dropped()["zero_variance"] >= 1
    carried = list(manager.ready)
    second = manager.next_batch(weight_version=0)
    assert [g.prompt_id for g in second[: len(carried)]] == [g.prompt_id for g in carried]


def test_partial_groups_are_carried_and_completed_with_their_version():
    producer = ScriptedProducer(hold_back={p.prompt_id: 1 for p in PROMPTS}, version=0)
    original = producer.__call__

    def newer_each_round(requests, seed):   # the trainer moves on between rounds
        out = original(requests, seed)
        producer.version += 1
        return out

    manager = RolloutManager(newer_each_round, DataBuffer(PROMPTS, 1),
                             settings(batch_groups=2, oversample=1.0), seed=0)
    batch = manager.next_batch(weight_version=1)
    assert_whole(batch, 3)
    first, second = producer.requests
    assert [idx for _, idx in first] == [(0, 1, 2), (0, 1, 2)]
    assert second == [(pid, (1, 2)) for pid, _ in first]   # only the missing completions, same prompts
    assert [g.prompt_id for g in batch] == [pid for pid, _ in first]
    for g in batch:
        assert [s.weight_version for s in g.samples] == [0, 1, 1] and g.weight_version == 0
    assert manager.stats["partial_groups_carried"] == 2


def test_stale_partial_groups_are_dropped():
    producer = ScriptedProducer(hold_back={pid.prompt_id: 1 for pid in PROMPTS}, version=0)
    manager = RolloutManager(producer, DataBuffer(PROMPTS, 2), settings(max_staleness=1), seed=0)
    manager._round(manager.source.next_batch(6))
    assert len(manager.pending) == 6 and not manager.ready
    producer.hold_back.clear()
    producer.version = 3
    manager.next_batch(weight_version=3)   # the version-0 partials are 3 behind, bound is 1
    assert manager.dropped()["stale"] == 6
    assert all(s.weight_version == 3 for g in manager.ready for s in g.samples)


def test_filter_rejecting_everything_is_a_clear_error():
    producer = ScriptedProducer(failed={p.prompt_id: "reward_error" for p in PROMPTS})
    manager = RolloutManager(producer, DataBuffer(PROMPTS, 0), settings(max_empty_rounds=3), seed=0)
    with pytest.raises(FilterStarvationError, match=r"no group in 3 rounds.*reward_error"):
        manager.next_batch(weight_version=0)
    assert len(producer.requests) == 3


def test_equal_rewards_alone_fall_back_to_the_batch_as_it_is():
    """A solved task (every group equal) has no signal, which is no reason to stop the run: after
    max_empty_rounds the batch is the newest equal groups, counted and logged."""
    producer = ScriptedProducer(flat={p.prompt_id for p in PROMPTS})
    manager = RolloutManager(producer, DataBuffer(PROMPTS, 0), settings(max_empty_rounds=3), seed=0)
    batch = manager.next_batch(weight_version=0)
    assert len(batch) == 4 and len(producer.requests) == 3
    assert_whole(batch, 3)
    assert all(len(set(g.rewards)) == 1 for g in batch)
    assert manager.stats["zero_variance_fallback"] == 1 and manager.equal == []


def test_unrequested_samples_are_refused():
    def rogue(requests, seed):
        return ScriptedProducer()(requests, seed) + [Sample(
            prompt_id="stranger", group_index=0, prompt_tokens=[1], response_tokens=[2], loss_mask=[1],
            rollout_logprobs=[0.0], reward=1.0, weight_version=0, finish_reason="stop", terminated=True,
            truncated=False, truncation_reason=None)]
    manager = RolloutManager(rogue, DataBuffer(PROMPTS, 0), settings(), seed=0)
    with pytest.raises(ValueError, match="stranger.*not requested"):
        manager.next_batch(weight_version=0)


def test_state_round_trip_resumes_identically(tmp_path):
    def fresh():
        return RolloutManager(ScriptedProducer(flat={"p3", "p7"}, hold_back={"p9": 1}),
                              DataBuffer(PROMPTS, 4), settings(), seed=7)

    a = fresh()
    a.next_batch(weight_version=0)
    atomic_write_json(tmp_path / "rollout_state.json", a.state_dict())
    b = fresh()
    b.load_state_dict(json.loads((tmp_path / "rollout_state.json").read_text()))
    for version in (0, 1, 1):
        assert [g.to_dict() for g in a.next_batch(version)] == [g.to_dict() for g in b.next_batch(version)]
    assert a.state_dict() == b.state_dict()


def test_with_the_real_engine_on_copy():
    torch.set_num_threads(1)
    tok = build_digit_tokenizer()
    engine = InProcessEngine(build_model(LMModelConfig(seed=0), tok), tok, weight_version=2)
    task = DigitTask("copy", 1, 2, reward_kind="partial")
    # random weights, and a "length" finish scored (not a parse failure): most groups vary
    rollout = RolloutSettings(n=8, max_new_tokens=2, max_seq_len=16, length_is_parse_failure=False)
    manager = RolloutManager(engine_producer(engine, task, tok, rollout),
                             DataBuffer(task.make_prompts(30, seed=0), 0),
                             ManagerSettings(batch_groups=2, group_size=8, oversample=2.0, max_empty_rounds=50))
    batch = manager.next_batch(weight_version=2)
    assert len(batch) == 2
    assert_whole(batch, 8)
    for g in batch:
        assert g.weight_version == 2 and len(set(g.rewards)) > 1


def test_zero_variance_groups_are_kept_when_configured_and_failed_rewards_drop_their_group():
    first = [p.prompt_id for p in DataBuffer(PROMPTS, 0).next_batch(8)]   # what the first round draws
    flat = set(first[:3])
    failed = {first[5]: "reward_timeout", first[6]: "reward_nonfinite"}
    producer = ScriptedProducer(flat=flat, failed=failed)
    keep = RolloutManager(producer, DataBuffer(PROMPTS, 0),
                          settings(batch_groups=8, oversample=1.0, zero_variance="keep"), seed=0)
    kept = {g.prompt_id for g in keep.next_batch(weight_version=0)}
    drawn = {pid for rnd in producer.requests for pid, _ in rnd}
    assert flat & drawn and flat & drawn <= kept     # equal rewards kept: the configuration says keep
    assert failed.keys() & drawn and not kept & failed.keys()   # a failed reward is never trained on
    expected = {reason: 1 for pid, reason in failed.items() if pid in drawn}
    assert keep.dropped() == expected
    assert {(d.prompt_id, d.reason) for d in keep.take_drops()} == {(p, r) for p, r in failed.items() if p in drawn}
    drop = RolloutManager(ScriptedProducer(flat=flat), DataBuffer(PROMPTS, 0),
                          settings(batch_groups=8, oversample=1.0, zero_variance="drop"), seed=0)
    assert not {g.prompt_id for g in drop.next_batch(weight_version=0)} & flat
    assert drop.dropped()["zero_variance"] >= 1


def test_collect_plays_exactly_its_prompts_and_reports_every_drop():
    producer = ScriptedProducer(flat={"p1"}, hold_back={"p2": 1}, failed={"p3": "reward_error"})
    manager = RolloutManager(producer, None, settings(zero_variance="drop"), seed=3)
    got = manager.collect(PROMPTS[:5], weight_version=0)
    assert sorted(g.prompt_id for g in got.kept) == ["p0", "p2", "p4"]   # p2 completed in a second round
    assert_whole(got.kept, 3)
    assert sorted((d.prompt_id, d.reason) for d in got.dropped) == [("p1", "zero_variance"), ("p3", "reward_error")]
    assert len(producer.requests) == 2 and producer.requests[1] == [("p2", (1, 2))]
    assert manager.dropped() == {"zero_variance": 1, "reward_error": 1} and not manager.ready


def test_a_resumed_manager_never_hands_out_a_group_its_consumed_record_holds(tmp_path):
    """The trainer's durable record: a run killed after its checkpoint replays its rounds with
    the same seeds; the groups it trained after that checkpoint are dropped as "consumed",
    replaced by new ones, and nothing repeats, not even across a third incarnation."""
    def fresh(record):
        return RolloutManager(ScriptedProducer(flat={"p3"}), DataBuffer(PROMPTS, 4), settings(), seed=7,
                              consumed=record)

    record = ConsumedGroups(tmp_path)
    a = fresh(record)
    first = a.next_batch(weight_version=0)
    record.record(1, [g.uid for g in first])
    checkpoint = a.state_dict()  # a group carried into step 2 is in it
    carried = [g.uid for g in a.ready]
    assert carried
    trained = []
    for step in (2, 3):  # trained after the checkpoint, then killed
        batch = a.next_batch(weight_version=0)
        record.record(step, [g.uid for g in batch])
        trained += [g.uid for g in batch]
    assert set(carried) <= set(trained) and len(set(trained)) == 8 and all(len(u) == 32 for u in trained)
    reloaded = ConsumedGroups(tmp_path)
    assert reloaded.uids == {g.uid for g in first} | set(trained) and reloaded.steps == 3
    b = fresh(reloaded)
    b.load_state_dict(checkpoint)
    again = [g.uid for step in (2, 3) for g in b.next_batch(weight_version=0)]
    assert not set(again) & reloaded.uids and len(set(again)) == 8
    assert b.dropped()["consumed"] >= 2  # the carried group and the first replayed round's
    with pytest.raises(ConsumedRecordError, match="trained already"):
        reloaded.record(4, trained[:1])


def test_the_consumed_record_ignores_a_torn_last_line_and_refuses_a_corrupt_one(tmp_path):
    record = ConsumedGroups(tmp_path, rank=1)
    record.record(1, ["a", "b"])
    with open(record.path, "a", encoding="utf-8") as fh:
        fh.write('{"step": 2, "uids": ["c", ')  # killed while appending: step 2 never trained
    torn = ConsumedGroups(tmp_path, rank=1)
    assert torn.uids == {"a", "b"} and torn.steps == 1
    torn.record(2, ["d"])  # starts a line of its own
    assert ConsumedGroups(tmp_path, rank=1).uids == {"a", "b", "d"}
    lines = record.path.read_text().splitlines()
    record.path.write_text("\n".join([lines[0], "not json", lines[1]]) + "\n")
    with pytest.raises(ConsumedRecordError, match=r"rank_00001\.jsonl line 2"):
        ConsumedGroups(tmp_path, rank=1)
