"""Reward functions that misbehave, as a team's own code may: importable by the reward worker
processes (app/lm/reward_worker.py unpickles them by module path), so they live in a module."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from app.lm.tasks import DigitTask, Prompt


@dataclass(frozen=True)
class ScriptedReward:
    """The completion text says what the reward does: "hang", "raise", "nan", "inf", "text",
    "exit" (the worker process dies), or a number to return."""

    name: str = "scripted"

    def reward(self, prompt: object, completion_text: str) -> float:
        if completion_text == "hang":
            time.sleep(3600)
        if completion_text == "raise":
            raise ValueError("the user's reward raised")
        if completion_text == "exit":
            os._exit(3)
        if completion_text in ("nan", "inf"):
            return float(completion_text)
        if completion_text == "text":
            return "high"  # type: ignore[return-value]
        return float(completion_text)


def hangs_on(prompt: Prompt) -> bool:
    """The prompts whose reward never returns: those with an odd digit sum."""
    return sum(int(c) for c in prompt.prompt_id.split(":")[-1]) % 2 == 1


@dataclass(frozen=True)
class HangsOnOddDigitSums(DigitTask):
    """The digit task, except that its reward hangs on some prompts (hangs_on)."""

    def reward(self, prompt: Prompt, completion_text: str) -> float:
        if hangs_on(prompt):
            time.sleep(3600)
        return super().reward(prompt, completion_text)
