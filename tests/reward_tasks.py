"""Reward functions that misbehave, as a team's own code may: importable by the reward worker
processes (app/lm/reward_worker.py unpickles them by module path), so they live in a module."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.lm.tasks import DigitTask, Prompt


@dataclass(frozen=True)
class ScriptedReward:
    """The completion text says what the reward does: "hang", "raise", "nan", "inf", "text",
    "exit" (the worker process dies), or a number to return."""

    name: str = "scripted"

    def reward(self, record: Mapping[str, Any], completion_text: str) -> float:
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


def odd_digit_sum(answer: str) -> bool:
    return sum(int(c) for c in answer) % 2 == 1


def hangs_on(prompt: Prompt) -> bool:
    """The prompts whose reward never returns: those whose answer has an odd digit sum."""
    return odd_digit_sum(prompt.answer)


@dataclass(frozen=True)
class HangsOnOddDigitSums(DigitTask):
    """The digit task, except that its reward hangs on some prompts (hangs_on)."""

    def reward(self, record: Mapping[str, Any], completion_text: str) -> float:
        if odd_digit_sum(record["answer"]):
            time.sleep(3600)
        return super().reward(record, completion_text)


def slow_on_odd(record: Mapping[str, Any], completion_text: str) -> float:
    """A team's reward by import path (`tests.reward_tasks:slow_on_odd`): hangs on an odd `n`."""
    if int(record["n"]) % 2:
        time.sleep(3600)
    return float(completion_text.strip() == str(record["n"]))


def broken_reward(record: Mapping[str, Any], completion_text: str) -> float:
    """A team's reward with a bug (`tests.reward_tasks:broken_reward`): raises on every call,
    with a message of two lines (only the first belongs in a log line)."""
    raise ValueError(f"no field 'expected' in the record\n{sorted(record)}")


def breaks_on_long(record: Mapping[str, Any], completion_text: str) -> float:
    """Fails on completions longer than 2 characters, scores the others (`tests.reward_tasks:breaks_on_long`)."""
    if len(completion_text) > 2:
        raise ValueError("too long to parse")
    return float(len(completion_text))
