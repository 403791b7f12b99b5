"""From the `lm:` config section (app/config/lm.py) to the library's objects (app/lm).

One place turns settings into a tokenizer, a model, a task and rollout settings (the engines:
app/lm/rollout/engine_config.py), so
the self-play, training and evaluation steps of the LM workload all build the same things
from the same config. Nothing here downloads: a model is built from its shape or read from a
local directory, the tokenizer is built in process or read from a local tokenizer.json.
"""

from __future__ import annotations

from app.config.lm import LMConfig, LMModelSettings, LMRolloutSettings, LMTaskSettings, LMTokenizerSettings
from app.lm.causal_lm import LMModelConfig, build_model, load_model
from app.lm.reward_pool import RewardPool
from app.lm.tasks import CalculatorTask, DigitTask, Prompt, Task
from app.lm.tokenizer import build_digit_tokenizer, load_tokenizer
from app.lm.truncation import RolloutSettings


def build_tokenizer(cfg: LMTokenizerSettings):  # -> PreTrainedTokenizerFast
    if cfg.kind == "digits":
        return build_digit_tokenizer()
    assert cfg.path is not None  # the config validator requires it
    return load_tokenizer(cfg.path)


def model_shape(cfg: LMModelSettings) -> LMModelConfig:
    return LMModelConfig(**cfg.model_dump(exclude={"path"}))


def model_at(cfg: LMModelSettings, path: str | None, tokenizer):  # -> LlamaForCausalLM
    """The weights at `path` (a candidate or promoted directory), else the generation-0 model."""
    return load_model(path) if path else initial_model(cfg, tokenizer)


def initial_model(cfg: LMModelSettings, tokenizer):  # -> LlamaForCausalLM
    """The generation-0 model: the configured local directory, else a seeded random init."""
    if cfg.path is not None:
        return load_model(cfg.path)
    return build_model(model_shape(cfg), tokenizer)


def build_task(cfg: LMTaskSettings) -> Task:
    if cfg.name in ("copy", "reverse"):
        return DigitTask(kind=cfg.name, min_digits=cfg.min_digits, max_digits=cfg.max_digits,
                         reward_kind=cfg.reward_kind)
    return CalculatorTask(max_operand=cfg.max_operand, terms=cfg.terms, reward_kind=cfg.reward_kind,
                          max_calls=cfg.max_calls)


def train_prompts(task: Task, cfg: LMTaskSettings) -> list[Prompt]:
    return task.make_prompts(cfg.train_prompts, cfg.seed, "train")


def heldout_prompts(task: Task, cfg: LMTaskSettings) -> list[Prompt]:
    """The gate's prompts: a pure function of the config, so every node and every generation
    evaluates on the very same set."""
    return task.make_prompts(cfg.heldout_prompts, cfg.seed, "test")


def rollout_settings(cfg: LMRolloutSettings) -> RolloutSettings:
    return RolloutSettings(n=cfg.n, max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                           max_steps=cfg.max_steps, max_seq_len=cfg.max_seq_len,
                           length_is_parse_failure=cfg.length_is_parse_failure,
                           parse_failure_reward=cfg.parse_failure_reward, overlong_reward=cfg.overlong_reward,
                           overlong_group=cfg.overlong_group, truncated_reward=cfg.truncated_reward)


def greedy_settings(cfg: LMConfig) -> RolloutSettings:
    """Evaluation: one greedy completion per prompt, with the rollouts' truncation rules."""
    return rollout_settings(cfg.rollout).model_copy(
        update={"n": 1, "temperature": 0.0, "max_new_tokens": cfg.eval.max_new_tokens})


def reward_pool(cfg: LMConfig, task: Task) -> RewardPool:
    """The task's reward in `lm.reward_pool.workers` processes, each call within `timeout_s`."""
    return RewardPool(task, workers=cfg.reward_pool.workers, timeout_s=cfg.reward_pool.timeout_s)
