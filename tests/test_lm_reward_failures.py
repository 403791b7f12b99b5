"""A reward that fails is seen (issue 53, item 5): the first line of each failure in the log at
a bounded rate and in /status; a reward failing on every group for N scored batches stops the
workload with an error naming the function; truncated completions are scored, so a broken
reward cannot hide behind a model that never stops."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from app.config import Settings
from app.config.lm import LMTaskSettings
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.reward_failures import RewardFailing
from app.lm.reward_pool import InlineRewards, RewardPool
from app.lm.rollout.engine import InProcessEngine
from app.lm.setup import build_task
from app.lm.tasks import Prompt
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.grpo import sft_loss
from app.lm.train.rollout_sources import GeneratedGroups
from app.lm.truncation import RolloutSettings
from app.workloads import pipeline_context

pytestmark = pytest.mark.timeout(120)
TOK = build_digit_tokenizer()
NAME = "tests.reward_tasks:broken_reward"


def jsonl_task(tmp_path: Path, reward: str = NAME):
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "copy:{n}=", "n": {n}}}\n' for n in range(10, 70)))
    return build_task(LMTaskSettings(name="jsonl", path=tmp_path / "prompts.jsonl", reward=reward), TOK)


def batch(task, texts=("1", "22", "333")) -> list[tuple[Prompt, str]]:
    return [(p, t) for p in task.prompts[:4] for t in texts]


def test_first_lines_are_logged_at_a_bounded_rate_and_kept_for_status(tmp_path):
    scorer = InlineRewards(jsonl_task(tmp_path), stop_after=0)
    with capture_logs() as logs:
        for _ in range(3):
            scorer.score(batch(scorer.task))
    failed = [e for e in logs if e["event"] == "reward_failed"]
    assert len(failed) == 1  # 36 failures of one kind: one line
    assert failed[0]["reward"] == NAME and failed[0]["error"] == "ValueError: no field 'expected' in the record"
    snap = scorer.failures.snapshot()
    assert snap["failures"] == {"reward_error": 36} and snap["stopped"] is None
    assert snap["recent"] == [{"error": "ValueError: no field 'expected' in the record", "count": 36}]


def test_failing_on_every_group_for_n_batches_stops_naming_the_function(tmp_path):
    scorer = InlineRewards(jsonl_task(tmp_path), stop_after=3)
    for _ in range(2):
        scorer.score(batch(scorer.task))
    with pytest.raises(RewardFailing, match=r"reward tests\.reward_tasks:broken_reward failed on every group of 3 "
                                            r"scored batches in a row.*no field 'expected'"):
        scorer.score(batch(scorer.task))
    with pytest.raises(RewardFailing):  # and it stays stopped: a restarted daemon cannot go on with it
        scorer.score(batch(scorer.task, ("1",)))


def test_a_batch_with_one_whole_group_resets_the_count(tmp_path):
    scorer = InlineRewards(jsonl_task(tmp_path, "tests.reward_tasks:breaks_on_long"), stop_after=2)
    task = scorer.task
    for _ in range(5):  # every other batch has a group whose completions all score
        scorer.score(batch(task, ("1", "333")))
        scorer.score([(task.prompts[0], "1"), (task.prompts[0], "22"), (task.prompts[1], "333")])
    assert scorer.failures.failed_batches_in_a_row == 0 and scorer.failures.stopped is None
    assert scorer.failures.snapshot()["failures"] == {"reward_error": 25}


def test_the_pool_reports_the_same_way(tmp_path):
    pool = RewardPool(jsonl_task(tmp_path), workers=1, timeout_s=5.0, stop_after=2)
    try:
        pool.score(batch(jsonl_task(tmp_path)))
        with pytest.raises(RewardFailing, match="tests.reward_tasks:broken_reward"):
            pool.score(batch(jsonl_task(tmp_path)))
        assert pool.failures.snapshot()["recent"][0]["error"].startswith("ValueError: no field 'expected'")
    finally:
        pool.close()


def test_the_online_loop_stops_when_every_truncated_completion_fails(tmp_path):
    """A random model never stops within 3 tokens: every completion is cut at max_new_tokens.
    Scored by default, the broken reward is seen and stops the run, naming the function."""
    torch.set_num_threads(1)
    task = jsonl_task(tmp_path)
    model = build_model(LMModelConfig(seed=1), TOK)
    engine = InProcessEngine(copy.deepcopy(model), TOK)
    rewards = InlineRewards(task, stop_after=2)
    source = GeneratedGroups(engine, task, TOK, task.make_prompts(40, 0), seed=0, prompts_per_step=4,
                             rollout=RolloutSettings(n=2, max_new_tokens=3), rewards=rewards)
    backend = LocalBackend(model, OptimConfig(), sft_loss)
    source.begin(backend, 0)
    with pytest.raises(RewardFailing, match="tests.reward_tasks:broken_reward"):
        source.batch(backend, 1)
    assert rewards.failures.snapshot()["failures"]["reward_error"] >= 8  # every completion was scored


def test_node_status_shows_the_first_line_and_selfplay_stops(tmp_path):
    (tmp_path / "prompts.jsonl").write_text("".join(f'{{"prompt": "copy:{n}=", "n": {n}}}\n' for n in range(10, 70)))
    settings = Settings.model_validate({"workload": "lm", "node": {"data_dir": str(tmp_path / "data")}, "lm": {
        "task": {"name": "jsonl", "path": str(tmp_path / "prompts.jsonl"), "reward": NAME, "train_prompts": 40,
                 "heldout_prompts": 8},
        "grpo": {"mode": "rl"},
        "rollout": {"n": 2, "batch_groups": 2, "max_new_tokens": 3},
        "reward_pool": {"stop_after_failed_batches": 2}}})
    pipe = pipeline_context(settings)
    from app.coordination.pipeline.runner_settings import SelfplaySettings
    try:
        pipe.steps.selfplay_batch(pipe, SelfplaySettings(rest_s=0.0), lambda: False)
        status = pipe.steps.node_status(pipe)["lm_reward_failures"]
        assert status["reward"] == NAME and status["failures"]["reward_error"] >= 2
        assert status["recent"][0]["error"].startswith("ValueError: no field 'expected'") and not status["stopped"]
        with pytest.raises(RewardFailing, match=NAME):
            pipe.steps.selfplay_batch(pipe, SelfplaySettings(rest_s=0.0), lambda: False)
        assert NAME in pipe.steps.node_status(pipe)["lm_reward_failures"]["stopped"]
    finally:
        pipe.steps.close()
