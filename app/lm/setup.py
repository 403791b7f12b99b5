"""From the `lm:` config section (app/config/lm.py) to the library's objects (app/lm).

One place turns settings into a tokenizer, a model, a task and rollout settings (the engines:
app/lm/rollout/engine_config.py), so
the self-play, training and evaluation steps of the LM workload all build the same things
from the same config. Nothing here downloads: a model is built from its shape or read from a
local directory, the tokenizer is built in process or read from a local directory.

`check_inputs` is what a node and a training run do first: every file and import the config
names (model directory, tokenizer, prompt file, reward) is read once, and a problem is one
line naming the file or key (`LMInputError`), before any daemon or rank starts on it.
"""

from __future__ import annotations

from typing import Any

from app.config.lm import LMConfig, LMModelSettings, LMRolloutSettings, LMTaskSettings, LMTokenizerSettings
from app.lm.causal_lm import LMModelConfig, ModelLoadError, build_model, check_model_dir, load_model
from app.lm.prompt_file import PromptFileError, load_jsonl_task
from app.lm.reward_pool import RewardPool
from app.lm.rewards import RewardLoadError, load_reward, reward_name
from app.lm.tasks import CalculatorTask, DigitTask, Prompt, Task
from app.lm.tokenizer import TokenizerLoadError, build_digit_tokenizer, load_tokenizer
from app.lm.truncation import RolloutSettings

LMInputError = (ModelLoadError, TokenizerLoadError, PromptFileError, RewardLoadError)  # each a ValueError


def build_tokenizer(cfg: LMTokenizerSettings):  # -> PreTrainedTokenizerBase
    if cfg.kind == "digits":
        return build_digit_tokenizer()
    assert cfg.path is not None  # the config validator requires it
    return load_tokenizer(cfg.path)


def model_shape(cfg: LMModelSettings) -> LMModelConfig:
    return LMModelConfig(**cfg.model_dump(exclude={"path", "dtype", "gradient_checkpointing"}))


def model_at(cfg: LMModelSettings, path: str | None, tokenizer):  # -> PreTrainedModel
    """The weights at `path` (a candidate or promoted directory), else the generation-0 model."""
    if path:
        return load_model(path, cfg.dtype, key="model directory", attn_implementation=cfg.attn_implementation)
    return initial_model(cfg, tokenizer)


def initial_model(cfg: LMModelSettings, tokenizer):  # -> PreTrainedModel
    """The generation-0 model: the configured local directory, else a seeded random init."""
    if cfg.path is not None:
        return load_model(cfg.path, cfg.dtype, attn_implementation=cfg.attn_implementation)
    return build_model(model_shape(cfg), tokenizer, cfg.dtype)


def for_training(lm: LMConfig, model: Any, seed: int = 0):  # -> PreTrainedModel or PeftModel
    """The model as the trainer holds it: activation checkpointing and LoRA adapters as configured."""
    if lm.model.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lm.lora is not None:
        from app.lm.lora import with_lora  # peft: imported only when LoRA is on

        model = with_lora(model, lm.lora, seed)
    return model


def build_task(cfg: LMTaskSettings, tokenizer: Any = None, *, need_demonstrations: bool = False) -> Task:
    """The configured task; a jsonl task reads its prompt file (rendering `messages` with
    `tokenizer`'s chat template) and imports its reward."""
    if cfg.name in ("copy", "reverse"):
        return DigitTask(kind=cfg.name, min_digits=cfg.min_digits, max_digits=cfg.max_digits,
                         reward_kind=cfg.reward_kind)
    if cfg.name == "calc":
        return CalculatorTask(max_operand=cfg.max_operand, terms=cfg.terms, reward_kind=cfg.reward_kind,
                              max_calls=cfg.max_calls)
    assert cfg.path is not None and cfg.reward is not None  # the config validator requires them
    if tokenizer is None:
        raise ValueError("a jsonl task needs the tokenizer (its chat template renders messages)")
    return load_jsonl_task(cfg.path, load_reward(cfg.reward), tokenizer, reward_name=f"reward {reward_name(cfg.reward)}",
                           demonstration_field=cfg.demonstration_field, need_demonstrations=need_demonstrations)


def check_inputs(lm: LMConfig) -> tuple[Any, Task]:
    """(tokenizer, task), every named file and import read once; raises one of LMInputError."""
    if lm.model.path is not None:
        check_model_dir(lm.model.path)
    tokenizer = build_tokenizer(lm.tokenizer)
    task = build_task(lm.task, tokenizer, need_demonstrations=lm.grpo.mode == "sft+rl")
    train_prompts(task, lm.task)
    heldout_prompts(task, lm.task)
    return tokenizer, task


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
    return RewardPool(task, workers=cfg.reward_pool.workers, timeout_s=cfg.reward_pool.timeout_s,
                      stop_after=cfg.reward_pool.stop_after_failed_batches)
