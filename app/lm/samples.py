"""What a rollout produces: one `Sample` per completion, kept whole per prompt in a `Group`.

Three kinds of facts are kept apart on purpose: the engine's `finish_reason` (why generation
stopped: "stop", "length", "abort"), whether the episode ended by its own rules
(`terminated`), and whether it was cut (`truncated`, with `truncation_reason` "max_steps",
"env" or "max_seq_len"). Every sample records the weight version that produced it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

FINISH_REASONS = ("stop", "length", "abort")
TRUNCATION_REASONS = ("max_steps", "env", "max_seq_len")


@dataclass
class Sample:
    prompt_id: str
    group_index: int                # which completion of the prompt's group
    prompt_tokens: list[int]
    response_tokens: list[int]      # everything after the prompt (model + tool/env tokens in multi-turn)
    loss_mask: list[int]            # per response token: 1 = model-generated, 0 = tool/env tokens
    rollout_logprobs: list[float]   # per response token, log-prob under the sampling policy (0.0 where mask 0)
    reward: float
    weight_version: int
    finish_reason: str              # the ENGINE's: "stop" | "length" | "abort"
    terminated: bool                # the episode ended by its own rules
    truncated: bool                 # the episode was cut
    truncation_reason: str | None   # "max_steps" | "env" | "max_seq_len" | None
    metadata: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Refuse inconsistent samples at construction, naming the prompt and the fault."""
        n = len(self.response_tokens)
        where = f"sample {self.prompt_id}#{self.group_index}"
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(f"{where}: response has {n} tokens but loss_mask has {len(self.loss_mask)} "
                             f"and rollout_logprobs {len(self.rollout_logprobs)}")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"{where}: loss_mask must hold only 0 and 1")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"{where}: finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
        if self.truncated != (self.truncation_reason is not None):
            raise ValueError(f"{where}: truncated={self.truncated} but truncation_reason={self.truncation_reason!r}")
        if self.truncation_reason is not None and self.truncation_reason not in TRUNCATION_REASONS:
            raise ValueError(f"{where}: truncation_reason {self.truncation_reason!r} not in {TRUNCATION_REASONS}")
        if self.terminated and self.truncated:
            raise ValueError(f"{where}: an episode is either terminated or truncated, not both")

    @property
    def tokens(self) -> list[int]:
        return self.prompt_tokens + self.response_tokens

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(**data)


@dataclass
class Group:
    """All samples of one prompt, kept whole: GRPO normalises advantages within it."""

    prompt_id: str
    samples: list[Sample]
    weight_version: int
    uid: str = ""  # who made it, when: what the trainer's consumed record keys (app/lm/train/consumed.py)

    def __post_init__(self) -> None:
        for s in self.samples:
            if s.prompt_id != self.prompt_id:
                raise ValueError(f"group {self.prompt_id}: holds a sample of prompt {s.prompt_id}")

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    @property
    def oldest_version(self) -> int:
        """The weight version that staleness is judged by: that of the oldest sample."""
        return min((s.weight_version for s in self.samples), default=self.weight_version)

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_id": self.prompt_id, "weight_version": self.weight_version, "uid": self.uid,
                "samples": [s.to_dict() for s in self.samples]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Group:
        return cls(prompt_id=data["prompt_id"], weight_version=data["weight_version"], uid=data.get("uid", ""),
                   samples=[Sample.from_dict(s) for s in data["samples"]])
