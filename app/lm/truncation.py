"""Rollout settings and what truncation does to a sample's reward, mask and group.

Kept apart on purpose (item 9): the engine's `finish_reason` says why generation stopped;
`terminated` / `truncated` + `truncation_reason` say how the episode ended. Each case has an
explicit setting and leaves a mark in the sample's metadata, never a silent choice:

- a "length" completion (the engine ran out of `max_new_tokens`) is scored on its text by
  default, like any other: a reward that fails is then seen even when every completion is cut
  (issue 53); `length_is_parse_failure` gives it `parse_failure_reward` instead, metadata
  `parse_failure="length"`;
- a sample cut to `max_seq_len` (`truncation_reason="max_seq_len"`): its reward is the score
  of the cut text (default) or zero (`overlong_reward`), and its group is kept, kept with this
  sample's loss masked out (the sample still counts in the group's mean and std), or dropped
  whole by the filter (`overlong_group`), metadata `overlong=...`;
- "max_steps" and "env" truncations are scored on the text so far (`truncated_reward=None`)
  or get a fixed reward.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RolloutSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(8, ge=1)                        # completions per prompt (the GRPO group size)
    max_new_tokens: int = Field(16, ge=1)          # per model step
    temperature: float = Field(1.0, ge=0.0)
    max_steps: int = Field(4, ge=1)                # model steps per episode
    max_seq_len: int = Field(128, ge=2)            # prompt + response tokens
    length_is_parse_failure: bool = False          # True: a "length" completion gets parse_failure_reward
    parse_failure_reward: float = 0.0
    overlong_reward: Literal["zero", "score"] = "score"
    overlong_group: Literal["keep", "mask_loss", "drop_group"] = "keep"
    truncated_reward: float | None = None          # for max_steps / env truncations; None = score the text


def reward_rule(mask: list[int], truncation_reason: str | None, metadata: dict,
                settings: RolloutSettings) -> tuple[float | None, list[int], dict]:
    """(the reward a rule fixes, or None when the task's reward scores the text; the loss mask;
    metadata to add) for a finished episode, per the settings. The scoring itself runs in the
    reward pool (app/lm/reward_pool.py), never here.

    `metadata` carries the episode's flags: "aborted" (the engine gave up on it) and
    "parse_failure" (set for a "length" completion when that counts as one)."""
    mask = list(mask)
    if metadata.get("aborted"):
        return 0.0, mask, {}
    if metadata.get("parse_failure"):
        return settings.parse_failure_reward, mask, {}
    if truncation_reason == "max_seq_len":
        if settings.overlong_group == "mask_loss":
            mask = [0] * len(mask)
        return (0.0 if settings.overlong_reward == "zero" else None), mask, {"overlong": settings.overlong_group}
    if truncation_reason is not None and settings.truncated_reward is not None:
        return settings.truncated_reward, mask, {}
    return None, mask, {}
