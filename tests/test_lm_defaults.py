"""One set of RL defaults for both entry points (issue 53, item 6): scripts/sft_rl.py and the
online loop's filters take the node config's (`lm.*`), and those drop zero-variance groups and
refill the batch by over-sampling (DAPO's dynamic sampling)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from app.config.lm import LMConfig
from app.lm.train.rollout_sources import LoopFilters
from app.lm.truncation import RolloutSettings

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "sft_rl.py"


def sft_rl_defaults():
    spec = importlib.util.spec_from_file_location("sft_rl_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_parser().parse_args(["--run-dir", "unused"])


def test_dynamic_sampling_is_the_default():
    cfg = LMConfig()
    assert cfg.rollout.zero_variance == "drop" and cfg.rollout.oversample == 2.0
    assert LoopFilters() == LoopFilters(cfg.rollout.oversample, cfg.rollout.zero_variance, cfg.rollout.max_staleness)


def test_sft_rl_runs_the_config_defaults():
    cfg, args = LMConfig(), sft_rl_defaults()
    assert (args.oversample, args.zero_variance, args.max_staleness) == \
        (cfg.rollout.oversample, cfg.rollout.zero_variance, cfg.rollout.max_staleness)
    assert (args.sft_steps, args.sft_lr, args.rl_lr) == (cfg.grpo.sft.steps, cfg.grpo.sft.lr, cfg.grpo.lr)
    assert (args.group_size, args.prompts_per_step, args.temperature, args.kl_coef) == \
        (cfg.rollout.n, cfg.grpo.groups_per_step, cfg.rollout.temperature, cfg.grpo.kl_coef)
    assert (args.overlong_group, args.max_seq_len) == (cfg.rollout.overlong_group, cfg.rollout.max_seq_len)


def test_truncation_rules_agree_with_the_config():
    cfg, rules = LMConfig().rollout, RolloutSettings()
    for key in ("length_is_parse_failure", "parse_failure_reward", "overlong_reward", "overlong_group",
                "truncated_reward", "max_seq_len", "max_steps", "temperature", "max_new_tokens"):
        assert getattr(rules, key) == getattr(cfg, key), key
    assert not rules.length_is_parse_failure and rules.overlong_reward == "score"  # truncated ones are scored


def group(prompt_id: str, rewards: list[float]):
    from app.lm.samples import Group, Sample

    samples = [Sample(prompt_id=prompt_id, group_index=i, prompt_tokens=[1], response_tokens=[5, 2], loss_mask=[1, 1],
                      rollout_logprobs=[-1.0, -1.0], reward=r, weight_version=0, finish_reason="stop",
                      terminated=True, truncated=False, truncation_reason=None, metadata={})
               for i, r in enumerate(rewards)]
    return Group(prompt_id=prompt_id, samples=samples, weight_version=0)


def test_the_stored_path_drops_equal_groups_at_training_time():
    """Self-play stores every group; StoredGroups applies lm.rollout.zero_variance: equal groups
    are skipped and the step drawn on, and a dataset without signal still trains (as keep)."""
    from app.lm.data_buffer import DataBuffer
    from app.lm.train.rollout_sources import StoredGroups

    backend = type("OneRank", (), {"rank": 0, "world_size": 1})()
    equal = [group(f"e{i}", [0.0, 0.0]) for i in range(6)]
    mixed = equal[:2] + [group(f"s{i}", [0.0, 1.0]) for i in range(2)]
    source = StoredGroups(DataBuffer(mixed, 0), groups_per_step=2, zero_variance="drop")
    for _ in range(5):  # 4 x 2 draws hold a whole epoch: both groups with signal
        batch = source.batch(backend, 1)
        assert batch.stats["groups"] == 2 and len(batch.rows) == 4
        assert all(r.advantage != 0.0 for r in batch.rows)  # only groups with signal
    flat = StoredGroups(DataBuffer(equal, 0), groups_per_step=2, zero_variance="drop")
    batch = flat.batch(backend, 1)
    assert batch.stats["groups"] == 2 and batch.stats["skipped_zero_variance"] == 8  # drew 4 x 2, trained 2


def test_run_progress_reads_step_version_staleness_and_curve(tmp_path):
    """/status and /progress of a training run, from its metrics file's tail."""
    import json

    from app.lm.workload.run_metrics import run_progress

    assert run_progress(None) is None and run_progress(tmp_path) is None
    lines = [{"phase": "sft", "step": 5, "loss": 1.0},
             {"phase": "rl", "step": 1, "loss": 0.1, "weight_version": 0, "mean_reward": 0.2, "dropped_stale": 0},
             {"phase": "heldout", "step": 2, "mean_reward": 0.3, "exact_match": 0.25},
             {"phase": "rl", "step": 3, "loss": 0.2, "weight_version": 1, "mean_reward": 0.4,
              "dropped_zero_variance": 3, "dropped_stale": 0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines) + '{"phase": "rl", "st')
    got = run_progress(tmp_path)
    assert got["sft_step"] == 5 and got["step"] == 3 and got["policy_version"] == 1 and got["staleness"] == 1
    assert got["dropped"] == {"zero_variance": 3} and got["mean_reward"] == 0.4
    assert got["heldout"] == [{"step": 2, "reward": 0.3, "exact_match": 0.25}]
    assert "policy" not in got and got["remote_groups"] == 0
    # the trainer's newest weights for rollout workers (policy_publish.py): gossiped with the rest
    (tmp_path / "policy.json").write_text(json.dumps({"generation": 2, "version": 3, "sha256": "a" * 64,
                                                      "published": [[3, "a" * 64]]}))
    assert run_progress(tmp_path)["policy"] == {"generation": 2, "version": 3, "sha256": "a" * 64}
