"""Settings of the language-model workload (`workload: lm`) and the rule that keeps the two
workloads' settings apart.

A node runs one workload. `workload: connect4` (the default) is the AlphaZero loop; `workload:
lm` trains a language model with GRPO on a task with a verifiable reward. The `lm:` section
holds everything the LM workload reads: the model's shape, the tokenizer, the task, the
inference engines, rollouts, the GRPO and SFT steps, the rollout window of a generation and
the held-out evaluation with its gate. The names mirror the library's own settings
(`app/lm/causal_lm.py` LMModelConfig, `app/lm/truncation.py` RolloutSettings,
`app/lm/train/grpo.py` GRPOConfig) so a value means the same thing in both places.

The rule (`workload_problems`): a setting of the other workload is an error, never ignored.
A key counts as set when the file (or the caller) gives it, whatever its value: writing
`search: {simulations: 64}` on an LM node means someone expects it to do something, and it
would not. So an `lm:` section on a connect4 node is an error, and on an lm node so are the
sections `model`, `search`, `selfplay`, `export`, `gauntlet`, `promotion`, the key
`node.game`, and the `train` keys that only the AlphaZero trainer reads. The `train` keys
that place training on processes and nodes (`nproc`, `max_nodes`, `span_cpu_nodes`,
`join_timeout_s`) are shared: the torchrun launcher and spanned training serve both.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from app.config.base import StrictModel

Workload = Literal["connect4", "lm"]
CONNECT4_SECTIONS = ("model", "search", "selfplay", "export", "gauntlet", "promotion", "feedback")
SHARED_TRAIN_KEYS = frozenset({"nproc", "max_nodes", "span_cpu_nodes", "join_timeout_s"})


class LMModelShape(StrictModel):
    """The shape of a random-init Llama (app/lm/causal_lm.py builds it)."""

    hidden_size: int = Field(64, gt=0)
    layers: int = Field(2, gt=0)
    heads: int = Field(4, gt=0)
    kv_heads: int = Field(2, gt=0)
    intermediate: int = Field(128, gt=0)
    max_position: int = Field(128, gt=0)
    seed: int = 0
    attn_implementation: str = "sdpa"

    @model_validator(mode="after")
    def _heads_divide(self) -> LMModelShape:
        if self.hidden_size % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden_size {self.hidden_size} must divide by heads {self.heads} "
                             f"and heads by kv_heads {self.kv_heads}")
        return self


SHAPE_KEYS = ("hidden_size", "layers", "heads", "kv_heads", "intermediate", "max_position", "seed")


class LMModelSettings(LMModelShape):
    """The model: a random-init Llama of this shape, or any local Hugging Face causal-LM
    directory (`path`: read with AutoModelForCausalLM, never downloaded; its config.json gives
    the architecture, so the shape keys are refused beside it)."""

    path: Path | None = None  # a save_pretrained directory; None = build from the shape
    dtype: Literal["float32", "bfloat16"] = "float32"  # of the weights, in training and in the engine
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory)

    @model_validator(mode="after")
    def _shape_or_path(self) -> LMModelSettings:
        given = [k for k in SHAPE_KEYS if k in self.model_fields_set]
        if self.path is not None and given:
            raise ValueError(f"{', '.join(given)} shape a random-init model and would not act beside path "
                             f"{self.path} (its config.json gives the shape): remove them")
        return self


class LMTokenizerSettings(StrictModel):
    """`digits` is built in process (app/lm/tokenizer.py); `path` reads a saved tokenizer.json."""

    kind: Literal["digits", "file"] = "digits"
    path: Path | None = None  # a directory holding tokenizer.json (kind: file)

    @model_validator(mode="after")
    def _path_iff_file(self) -> LMTokenizerSettings:
        if (self.kind == "file") != (self.path is not None):
            raise ValueError("path is required with kind: file and not allowed with kind: digits")
        return self


class RewardTerm(StrictModel):
    """One term of a reward: a built-in (`exact_match`, `math`, `format`: app/lm/rewards.py) or
    an import path `package.module:function` (or a class, built with `args`), times `weight`."""

    fn: str = Field(min_length=1)
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of the function or class


TASK_KEYS = {  # the keys each task reads, besides name, train_prompts, heldout_prompts and seed
    "copy": {"reward_kind", "min_digits", "max_digits"},
    "reverse": {"reward_kind", "min_digits", "max_digits"},
    "calc": {"reward_kind", "max_operand", "terms", "max_calls"},
    "jsonl": {"path", "reward", "demonstration_field"},
}


class LMTaskSettings(StrictModel):
    """The task and its prompt sets. Train and held-out prompts never share a string
    (app/lm/tasks.py splits by a hash of the text). `jsonl` is the user's own: a prompt file
    (app/lm/prompt_file.py) and a reward named by import path (app/lm/rewards.py); the others
    are built-in toys with their own rewards."""

    name: Literal["copy", "reverse", "calc", "jsonl"] = "copy"
    reward_kind: Literal["exact", "partial"] = "exact"
    min_digits: int = Field(3, ge=1)  # copy / reverse
    max_digits: int = Field(3, ge=1)
    max_operand: int = Field(99, ge=1)  # calc
    terms: int = Field(2, ge=2)
    max_calls: int = Field(1, ge=0)
    path: Path | None = None  # jsonl: one JSON object a line, `prompt` or `messages` plus the reward's fields
    # jsonl: the reward, one term (a name or import path) or a weighted sum of terms
    reward: str | list[RewardTerm] | None = None
    demonstration_field: str = Field("completion", min_length=1)  # jsonl: what SFT trains on
    train_prompts: int = Field(512, ge=1)  # size of the training prompt pool (jsonl: at most)
    heldout_prompts: int = Field(64, ge=1)  # the held-out set of the gate (same prompts for both models)
    seed: int = 0

    @model_validator(mode="after")
    def _keys_of_the_task(self) -> LMTaskSettings:
        if self.min_digits > self.max_digits:
            raise ValueError(f"min_digits {self.min_digits} is above max_digits {self.max_digits}")
        others = set().union(*TASK_KEYS.values()) - TASK_KEYS[self.name]
        stray = sorted(others & self.model_fields_set)
        if stray:
            raise ValueError(f"{', '.join(stray)}: not read by task {self.name} (it reads "
                             f"{', '.join(sorted(TASK_KEYS[self.name]))})")
        if self.name == "jsonl" and (self.path is None or self.reward is None):
            raise ValueError("task jsonl needs path (the prompt file) and reward (a name or package.module:function)")
        if isinstance(self.reward, list) and not self.reward:
            raise ValueError("reward: an empty list of terms")
        return self


class LMEngineSettings(StrictModel):
    """One inference engine. The first engine of `lm.engines` generates the rollouts; every one
    is weight-synced to each promoted model (app/lm/rollout/weight_sync.py), within its own
    `sync_timeout_s`; a failed sync takes it out of service until a sync succeeds."""

    name: str = Field("local", min_length=1, max_length=64)
    kind: Literal["in_process", "sglang", "vllm"] = "in_process"
    url: str | None = None  # http://host:port of an sglang / vllm server
    model: str = "default"  # vllm: the served model name
    sync: Literal["disk", "tensor"] | None = None  # how weights reach it; default: tensor in process, disk over HTTP
    sync_timeout_s: float = Field(300.0, gt=0)  # one whole load (every call of it)
    request_timeout_s: float = Field(120.0, gt=0)  # one generation request
    tp_size: int = Field(1, ge=1, le=64)  # sglang tensor sync: one serialized copy per tensor-parallel rank
    nccl_master: str | None = None  # vllm tensor sync: "host:port" of the trainer's NCCL group (rank 0)

    @model_validator(mode="after")
    def _url_iff_http(self) -> LMEngineSettings:
        if self.kind == "in_process" and self.url is not None:
            raise ValueError(f"engine {self.name}: an in_process engine takes no url")
        if self.kind != "in_process" and self.url is None:
            raise ValueError(f"engine {self.name}: a {self.kind} engine needs a url")
        if self.tp_size != 1 and not (self.kind == "sglang" and self.sync == "tensor"):
            raise ValueError(f"engine {self.name}: tp_size is read by sglang engines with sync: tensor only")
        if (self.nccl_master is not None) != (self.kind == "vllm" and self.sync == "tensor"):
            raise ValueError(f"engine {self.name}: nccl_master ('host:port') is needed by, and only by, "
                             f"vllm engines with sync: tensor")
        return self

    @property
    def sync_mode(self) -> str:
        return self.sync or ("tensor" if self.kind == "in_process" else "disk")


class LMRolloutSettings(StrictModel):
    """Self-play of this workload: groups of `n` completions per prompt (app/lm/truncation.py)."""

    n: int = Field(8, ge=2)  # completions per prompt: the GRPO group (one sample has no baseline)
    batch_groups: int = Field(16, ge=1)  # groups per self-play batch (one store transaction each)
    max_new_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, gt=0.0)  # sampling; greedy is for evaluation only
    max_steps: int = Field(4, ge=1)
    max_seq_len: int = Field(128, ge=2)
    # truncated completions are scored unless told otherwise (a failing reward is then seen):
    length_is_parse_failure: bool = False  # True: a completion cut at max_new_tokens gets parse_failure_reward
    parse_failure_reward: float = 0.0
    overlong_reward: Literal["zero", "score"] = "score"  # a completion cut at max_seq_len: scored, or 0
    overlong_group: Literal["keep", "mask_loss", "drop_group"] = "keep"
    truncated_reward: float | None = None
    # weight versions a group may lag the trained model: trainer steps online, generations stored
    max_staleness: int = Field(1, ge=0, le=1000)
    # trainer steps between the policies an online trainer on a node with peers publishes for
    # rollout workers there (app/lm/train/policy_publish.py): each is the whole model written to
    # disk (~0.5 GB for 124M parameters), so a large model's trainer publishes every few steps
    publish_every: int = Field(1, ge=1, le=1000)
    # DAPO's dynamic sampling, the default of the mesh and of scripts/sft_rl.py alike (issue 53):
    # groups of equal rewards carry no GRPO signal and only shrink the others' share of the
    # normaliser, so they are dropped and the batch refilled by playing 2x the prompts it needs
    zero_variance: Literal["keep", "drop"] = "drop"
    oversample: float = Field(2.0, ge=1.0, le=8.0)  # prompts played per group a batch keeps


class LMSFTSettings(StrictModel):
    """Generation 1 of `mode: sft+rl`: supervised steps on the task's demonstrations."""

    steps: int = Field(60, ge=1)
    batch_size: int = Field(32, ge=1)
    lr: float = Field(3e-3, gt=0)


class LMLoRASettings(StrictModel):
    """Low-rank adapters (peft) instead of training every weight: the base weights stay frozen;
    a candidate is saved merged (what engines load) with its adapter beside it."""

    r: int = Field(8, ge=1)
    alpha: float = Field(16.0, gt=0)  # the update is scaled by alpha / r
    dropout: float = Field(0.0, ge=0.0, lt=1.0)  # > 0 makes the first GRPO ratio differ from 1
    target_modules: list[str] | Literal["all-linear"] = "all-linear"  # module names, or every linear layer


class LMGRPOSettings(StrictModel):
    """One generation's GRPO run (app/lm/train/grpo.py)."""

    mode: Literal["rl", "sft+rl"] = "sft+rl"
    steps: int = Field(50, ge=1)  # optimizer steps per generation
    groups_per_step: int = Field(8, ge=1)
    micro_batches: int = Field(1, ge=1)
    lr: float = Field(5e-4, gt=0)  # measured on copy, reverse-4 and arithmetic, 2 seeds: docs/benchmarks/lm_tasks.md
    warmup_steps: int = Field(0, ge=0)  # the learning rate rises linearly to lr over these first steps
    weight_decay: float = Field(0.0, ge=0)
    max_grad_norm: float | None = Field(1.0, gt=0)
    clip_low: float = Field(0.2, ge=0)
    clip_high: float = Field(0.2, ge=0)
    kl_coef: float = Field(0.0, ge=0)
    scale_by_std: bool = True
    eps: float = Field(1e-6, gt=0)
    backend: Literal["local", "fsdp2"] = "local"
    # where a generation's GRPO groups come from: "online" (the default, as TRL, verl and slime
    # run GRPO), generated in the trainer by its own newest weights, synced every step, at most
    # `lm.rollout.max_staleness` steps old (app/lm/train/generation.py); self-play then only
    # paces the generations. "stored": the exported window of self-play's groups (made by the
    # best model), trained against their stored log-probs. (Online was briefly not the default:
    # generation 1 then ran GRPO after its SFT, so "SFT" already held online GRPO's gain and the
    # user task never promoted a later generation; generation 1 is SFT alone now,
    # docs/benchmarks/grpo_loop.md)
    rollouts: Literal["stored", "online"] = "online"
    # online: every this many GRPO steps the trainer's weights answer the held-out prompts
    # greedily, a "heldout" line in the run's metrics (0: never)
    eval_every: int = Field(0, ge=0)
    # after a GRPO generation on the node, how long its trainer process stays for the next one
    # (app/shared/trainer_follow.py): the node hands it over when its parent is this candidate,
    # and it trains on with the weights and optimizer it holds, without a launch (the ranks'
    # start was ~half of a generation on the user task); 0: one torchrun launch a generation
    trainer_wait_s: float = Field(300.0, ge=0, le=3600)
    # online: the behaviour correction (app/lm/train/grpo.py): each token weighted by
    # min(pi_trainer / pi_engine, tis_cap), verl's and slime's truncated importance sampling,
    # for groups up to `lm.rollout.max_staleness` versions old; 0 = off (ratio against the engine's)
    tis_cap: float = Field(2.0, ge=0)
    seed: int = 0
    reference: Path | None = None  # KL reference: a model directory; None: the policy GRPO starts from
    sft: LMSFTSettings = LMSFTSettings()

    @model_validator(mode="after")
    def _eval_every_needs_online(self) -> LMGRPOSettings:
        if self.eval_every and self.rollouts != "online":
            raise ValueError("eval_every is read with rollouts: online only (the trainer's own engine answers the "
                             "held-out prompts); the stored mode's candidate is evaluated by the gate")
        if "tis_cap" in self.model_fields_set and self.rollouts != "online":
            raise ValueError("tis_cap is read with rollouts: online only (stored groups are trained against their "
                             "stored log-probs with the ratio clip)")
        return self


class LMExportSettings(StrictModel):
    """Which rollouts one generation trains on."""

    min_new_groups: int = Field(64, ge=1)  # new groups since the last generation before the next starts
    window_groups: int = Field(512, ge=1)  # newest groups exported for a generation


class LMEvalSettings(StrictModel):
    """The gate: candidate and best, greedy on the same held-out prompts, paired per prompt
    (app/lm/workload/heldout.py). Promote only when the candidate is better with `confidence`."""

    method: Literal["sign", "bootstrap"] = "sign"
    confidence: float = Field(0.95, gt=0.5, lt=1.0)
    min_improvement: float = Field(0.0, ge=0.0)  # the mean per-prompt gain must exceed this too
    max_new_tokens: int = Field(16, ge=1)
    bootstrap_samples: int = Field(2000, ge=100)
    seed: int = 0
    # What the next generation trains from. "head": the trainer runs on, as TRL, verl and slime
    # train: a rejected candidate is the next generation's start unless its held-out mean reward
    # is below the best's by more than `rollback_margin` (then the trainer goes back to the best);
    # "best": every generation starts from the best (AlphaZero's shape, each rejection thrown away)
    trains_from: Literal["head", "best"] = "head"
    rollback_margin: float = Field(0.05, ge=0.0)


class LMRewardPoolSettings(StrictModel):
    """Where a task's reward function runs (app/lm/reward_pool.py): worker processes, each call
    bounded; an error, a non-finite value or a timeout drops the sample's group."""

    workers: int = Field(1, ge=1, le=16)
    timeout_s: float = Field(10.0, gt=0)  # one reward call
    # the reward failed on every group of this many scored batches in a row: the workload stops
    # with an error naming the function (app/lm/reward_failures.py); 0 = never
    stop_after_failed_batches: int = Field(5, ge=0)


class LMConfig(StrictModel):
    model: LMModelSettings = LMModelSettings()
    tokenizer: LMTokenizerSettings = LMTokenizerSettings()
    task: LMTaskSettings = LMTaskSettings()
    engines: list[LMEngineSettings] = Field(default_factory=lambda: [LMEngineSettings()], min_length=1)
    rollout: LMRolloutSettings = LMRolloutSettings()
    grpo: LMGRPOSettings = LMGRPOSettings()
    lora: LMLoRASettings | None = None  # None: every weight trains
    export: LMExportSettings = LMExportSettings()
    eval: LMEvalSettings = LMEvalSettings()
    reward_pool: LMRewardPoolSettings = LMRewardPoolSettings()

    @model_validator(mode="before")
    @classmethod
    def _tokenizer_of_the_model(cls, data: Any) -> Any:
        """A model directory brings its tokenizer: without a `tokenizer` section, it is read from there."""
        if isinstance(data, dict) and "tokenizer" not in data:
            model = data.get("model")
            path = model.get("path") if isinstance(model, dict) else getattr(model, "path", None)
            if path is not None:
                return {**data, "tokenizer": {"kind": "file", "path": path}}
        return data

    @model_validator(mode="after")
    def _lora_needs_a_trained_base(self) -> LMConfig:
        if self.lora is not None and self.model.path is None:
            raise ValueError("lm.lora on a randomly initialised model (no lm.model.path) cannot learn: LoRA freezes "
                             "the embeddings and norms, which then stay random (SFT loss stalls at 5.08 nats against "
                             "1.17 fully fine-tuned); remove lm.lora to train every weight, or give a trained "
                             "model directory as lm.model.path")
        return self

    @model_validator(mode="after")
    def _engines_distinct(self) -> LMConfig:
        names = [e.name for e in self.engines]
        if len(set(names)) != len(names):
            raise ValueError(f"engine names must be distinct (weight-sync failures are reported by name): {names}")
        if sum(e.kind == "in_process" for e in self.engines) > 1:
            raise ValueError("at most one in_process engine per node")
        if self.rollout.max_new_tokens >= self.rollout.max_seq_len:
            raise ValueError(f"rollout.max_new_tokens {self.rollout.max_new_tokens} leaves no room for a prompt "
                             f"in max_seq_len {self.rollout.max_seq_len}")
        return self


def workload_problems(workload: Workload, given: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(dotted key, why) for every setting of the other workload. `given[section]` is the set of
    keys given in that section ("" for the top level's own keys, i.e. the sections given)."""
    top = given.get("", set())
    if workload == "connect4":
        return [("lm", "an lm section on a connect4 node (set workload: lm to run the language-model workload)")] \
            if "lm" in top else []
    problems = [(s, f"a connect4 setting on an lm node (the lm workload reads lm.*, not {s})")
                for s in CONNECT4_SECTIONS if s in top]
    if "game" in given.get("node", set()):
        problems.append(("node.game", "a connect4 setting on an lm node (the task is lm.task.name)"))
    problems += [(f"train.{k}", "read only by the connect4 trainer; the lm workload's are under lm.grpo")
                 for k in sorted(given.get("train", set()) - SHARED_TRAIN_KEYS)]
    return problems
