"""Rewards off the event loop (app/lm/reward_pool.py): a reward that hangs, raises, returns NaN
or kills its process becomes a failure reason, never a number, and the pool goes on; on a node,
a reward that hangs drops its group as `reward_timeout` (counted in the metrics and /status,
remembered in the store), the groups with working rewards are stored, and self-play keeps
running batch after batch."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from app.config import Settings
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.event_router import EventRouter
from app.coordination.pipeline.runner_settings import SelfplaySettings
from app.coordination.pipeline.runners import selfplay_daemon
from app.db.rollout_store import RolloutStore
from app.lm.reward_pool import InlineRewards, RewardPool
from app.lm.tasks import Prompt
from app.workloads import pipeline_context
from tests.reward_tasks import HangsOnOddDigitSums, ScriptedReward, hangs_on

pytestmark = pytest.mark.timeout(120)
P = Prompt("p1", "say a number", record={"id": 1})  # the reward reads the prompt's record


def test_each_failure_is_a_reason_and_the_pool_goes_on():
    pool = RewardPool(ScriptedReward(), workers=2, timeout_s=1.0)
    try:
        started = time.monotonic()
        got = pool.score([(P, "1.5"), (P, "hang"), (P, "raise"), (P, "nan"), (P, "inf"), (P, "text"), (P, "exit"),
                          (P, "-2")])
        assert time.monotonic() - started < 30  # the hang cost its timeout, not an hour
        assert [(s.value, s.failure) for s in got] == [
            (1.5, None), (None, "reward_timeout"), (None, "reward_error"), (None, "reward_nonfinite"),
            (None, "reward_nonfinite"), (None, "reward_error"), (None, "reward_error"), (-2.0, None)]
        assert "the user's reward raised" in got[2].detail and "timeout_s 1s" in got[1].detail
        assert "died" in got[6].detail
        assert pool.restarts == 2  # the hung worker and the dead one, each replaced
        again = pool.score([(P, str(v)) for v in range(6)])  # the pool is whole again
        assert [s.value for s in again] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert pool.seconds > 1.0  # the time spent scoring, reported as a step's reward_s
    finally:
        pool.close()
    assert pool.workers == []


def test_the_inline_scorer_has_the_same_contract_without_the_timeout():
    inline = InlineRewards(ScriptedReward())
    got = inline.score([(P, "3"), (P, "raise"), (P, "nan"), (P, "text")])
    assert [(s.value, s.failure) for s in got] == [(3.0, None), (None, "reward_error"),
                                                   (None, "reward_nonfinite"), (None, "reward_error")]


def test_a_task_that_cannot_be_sent_to_a_worker_is_refused_at_once():
    with pytest.raises(Exception, match="pickle|Can't"):
        RewardPool(type("Local", (), {"reward": lambda self, record, text: 1.0})(), workers=1)


async def test_a_hanging_reward_drops_its_group_and_the_node_keeps_playing(tmp_path: Path):
    settings = Settings.model_validate({"workload": "lm", "node": {"data_dir": str(tmp_path / "data")}, "lm": {
        "task": {"name": "copy", "min_digits": 2, "max_digits": 2, "train_prompts": 64, "heldout_prompts": 8},
        "rollout": {"n": 2, "batch_groups": 4, "max_new_tokens": 4,
                    "length_is_parse_failure": False}}})  # every completion is scored
    pipe = pipeline_context(settings)
    lm = settings.lm
    # the node's reward pool, over a team's reward that hangs on some prompts (0.5 s per call)
    pipe.steps._rewards = RewardPool(HangsOnOddDigitSums("copy", 2, 2, lm.task.reward_kind), workers=1,
                                     timeout_s=0.5)
    router = EventRouter()
    ctx = DaemonContext(name="selfplay", settings=SelfplaySettings(rest_s=0.0), router=router, app_settings=settings,
                        stopping=asyncio.Event(), log=None, metrics=router.metrics)
    daemon = asyncio.create_task(selfplay_daemon(pipe, ctx))
    db = pipe.steps.paths.rollouts_db

    def played() -> tuple[int, dict[str, int]]:
        with RolloutStore(db) as store:
            return store.count(pipe.node_id), store.dropped_counts(pipe.node_id)

    try:
        end = time.monotonic() + 90
        while True:  # three batches' worth: the node went on after its first timeouts
            stored, dropped = await asyncio.to_thread(played)
            if stored + sum(dropped.values()) >= 12 and stored and dropped:
                break
            assert time.monotonic() < end, (stored, dropped)
            assert not daemon.done(), daemon
            await asyncio.sleep(0.2)
    finally:
        ctx.stopping.set()
        await asyncio.wait_for(daemon, 60)
        pipe.steps.close()
    stored, dropped = played()  # after the stop: every batch finished
    assert set(dropped) == {"reward_timeout"} and stored >= 1
    with RolloutStore(db) as store:
        kept = store.groups()
    prompts = {p.prompt_id: p for p in pipe.steps._task_kit()[2]}
    assert kept and not [g.prompt_id for g in kept if hangs_on(prompts[g.prompt_id])]  # no hung prompt's group
    status = pipe.steps.node_status(pipe)
    assert status["lm_rollouts_dropped"] == dropped  # /status, the store and the metric agree
    assert router.metrics.value("mesh_selfplay_items_dropped_total", reason="reward_timeout") == \
        dropped["reward_timeout"]


def test_a_reward_named_by_import_path_runs_in_the_pool_within_its_timeout(tmp_path: Path):
    """#43's reward (`package.module:function` on a prompt file's records) through this pool."""
    from app.config.lm import LMTaskSettings
    from app.lm.setup import build_task
    from app.lm.tokenizer import build_digit_tokenizer

    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "copy:{n}=", "n": {n}}}\n' for n in range(10, 40)))
    task = build_task(LMTaskSettings(name="jsonl", path=tmp_path / "prompts.jsonl",
                                     reward="tests.reward_tasks:slow_on_odd"), build_digit_tokenizer())
    by_n = {p.record["n"]: p for p in task.prompts}  # every line of the file, as a prompt
    pool = RewardPool(task, workers=2, timeout_s=0.5)
    try:
        got = pool.score([(by_n[12], "12"), (by_n[13], "13"), (by_n[14], "7")])
    finally:
        pool.close()
    assert [(s.value, s.failure) for s in got] == [(1.0, None), (None, "reward_timeout"), (0.0, None)]
