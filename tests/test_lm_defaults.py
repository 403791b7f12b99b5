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
