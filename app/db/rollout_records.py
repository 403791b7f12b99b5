"""The LM workload's rollout records: one prompt's group of scored completions, as self-play
stores it (app/db/rollout_store.py) and replication sends it.

Plain pydantic models rather than app/lm's Sample/Group: the database layer sits below the
language-model package (app/lm/rollout/batches.py converts), and the same models parse the
records a peer sends, so a malformed one is refused, naming the field, before any write.
The checks are those of app/lm/samples.py: per-token lists of one length, a 0/1 loss mask,
`truncated` exactly when there is a `truncation_reason`, never terminated and truncated at
once, distinct group indices, and the group's weight version its oldest sample's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RolloutSampleRecord(_Record):
    """One completion of a group, with the facts app/lm/samples.py keeps apart."""

    group_index: int = Field(ge=0)
    response_tokens: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    reward: float
    weight_version: int = Field(ge=0)
    finish_reason: Literal["stop", "length", "abort"]
    terminated: bool
    truncated: bool
    truncation_reason: Literal["max_steps", "env", "max_seq_len"] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> RolloutSampleRecord:
        n = len(self.response_tokens)
        if len(self.loss_mask) != n or len(self.rollout_logprobs) != n:
            raise ValueError(f"sample {self.group_index}: {n} tokens but {len(self.loss_mask)} mask values "
                             f"and {len(self.rollout_logprobs)} log-probs")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError(f"sample {self.group_index}: loss_mask must hold only 0 and 1")
        if any(t < 0 or t >= 2**31 for t in self.response_tokens):
            raise ValueError(f"sample {self.group_index}: token ids must be in 0..2^31-1")
        if self.truncated != (self.truncation_reason is not None):
            raise ValueError(f"sample {self.group_index}: truncated={self.truncated} "
                             f"but truncation_reason={self.truncation_reason!r}")
        if self.terminated and self.truncated:
            raise ValueError(f"sample {self.group_index}: terminated and truncated at once")
        return self


class RolloutGroupRecord(_Record):
    """One prompt's group, as self-play stores it and replication sends it."""

    uid: str = Field(min_length=1, max_length=64)
    node_id: str = Field(max_length=128)  # the node that generated it (the replication origin)
    task: str = Field(max_length=64)
    prompt_id: str = Field(min_length=1, max_length=256)
    prompt_tokens: list[int] = Field(min_length=1)
    weight_version: int = Field(ge=0)  # the oldest sample's: staleness is judged by the worst case
    model_sha256: str | None = Field(default=None, max_length=64)  # the checkpoint that sampled
    created_at: float
    samples: list[RolloutSampleRecord] = Field(min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> RolloutGroupRecord:
        indices = [s.group_index for s in self.samples]
        if len(set(indices)) != len(indices):
            raise ValueError(f"group {self.uid}: a group index appears twice: {indices}")
        if self.weight_version != min(s.weight_version for s in self.samples):
            raise ValueError(f"group {self.uid}: weight_version {self.weight_version} is not its oldest "
                             f"sample's {min(s.weight_version for s in self.samples)}")
        if any(t < 0 or t >= 2**31 for t in self.prompt_tokens):
            raise ValueError(f"group {self.uid}: token ids must be in 0..2^31-1")
        return self

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]
