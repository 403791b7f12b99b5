"""Tasks with verifiable rewards, as pure objects: prompts, rewards, demonstrations, episodes.

A prompt carries its record: the JSON object it came from (a prompt file's line,
app/lm/prompt_file.py), or for the built-in tasks `{"prompt": text, "answer": answer}`. A
task's reward is one call, `task.reward(prompt.record, completion_text) -> float`, the same
signature as a user's reward function (app/lm/rewards.py).

A prompt's split is a pure function of its content (a hash), so the held-out split never
shares a string with the training split whatever the seeds. Rewards are either exact match or
partial credit (the fraction of answer positions right, over the longer of answer and
completion, so padding an answer with junk is never free).

Episodes (`new_episode`) are the environment side of agent steps: after each model step the
episode says what the environment appends and whether it ended (`terminated`) or was cut by
its own rules (`truncated`, reason "env"). Single-turn tasks end after the first model step.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from app.lm.calculator import CalculatorError, evaluate

RewardKind = Literal["exact", "partial"]
Split = Literal["train", "test"]
CALL, END_CALL, RESULT, END_RESULT = "<call>", "</call>", "<result>", "</result>"


@dataclass(frozen=True)
class Prompt:
    prompt_id: str
    text: str
    answer: str = ""  # the reference completion (what SFT trains on), "" when there is none
    record: Mapping[str, Any] = field(default_factory=dict)  # what the reward reads; see the module doc
    rendered: bool = False  # `text` is a chat template's output: its special tokens are already in it

    def __post_init__(self) -> None:
        if not self.record:
            object.__setattr__(self, "record", {"prompt": self.text, "answer": self.answer})


def prompt_token_ids(tokenizer: Any, prompt: Prompt) -> list[int]:
    """The prompt's tokens: the tokenizer's own special tokens (a BOS) are added to plain text,
    never to a chat template's output, which already holds them."""
    return tokenizer(prompt.text, add_special_tokens=not prompt.rendered)["input_ids"]


@dataclass(frozen=True)
class EnvStep:
    """What the environment does after one model step."""

    observation: str = ""      # text appended to the context (tool result); "" for none
    terminated: bool = False   # the episode ended by its rules
    truncated: bool = False    # the environment cut the episode (truncation_reason "env")


class Episode(Protocol):
    def step(self, model_text: str) -> EnvStep: ...


class Task(Protocol):
    name: str
    stop_markers: tuple[str, ...]   # texts that end a model step, besides the eos token

    def make_prompts(self, n: int, seed: int, split: Split = "train") -> list[Prompt]: ...
    def reward(self, record: Mapping[str, Any], completion_text: str) -> float: ...
    def demonstration(self, prompt: Prompt) -> str: ...
    def new_episode(self, prompt: Prompt) -> Episode: ...


def split_of(text: str, test_fraction: float = 0.2) -> Split:
    """A pure, seed-free split: the same string always lands on the same side."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") / 2**32
    return "test" if bucket < test_fraction else "train"


def positional_credit(answer: str, completion: str) -> float:
    """Fraction of positions right, over the longer of the two strings."""
    longest = max(len(answer), len(completion))
    if longest == 0:
        return 1.0
    return sum(a == c for a, c in zip(answer, completion)) / longest


def score(answer: str, completion: str, kind: RewardKind) -> float:
    if kind == "exact":
        return float(completion == answer)
    return positional_credit(answer, completion)


def _draw_unique(n: int, seed: int, split: Split, draw, name: str, space: int) -> list[str]:
    """`n` distinct strings of `split` from `draw(rng)`; an impossible request fails, never loops forever."""
    rng = random.Random(f"{name}:{seed}:{split}")
    seen: list[str] = []
    chosen: set[str] = set()
    for _ in range(max(50 * n, 1000)):
        if len(seen) == n:
            break
        s = draw(rng)
        if s not in chosen and split_of(s) == split:
            chosen.add(s)
            seen.append(s)
    if len(seen) < n:
        raise ValueError(f"task {name}: only {len(seen)} distinct {split} prompts found of {n} asked "
                         f"(about {space} exist)")
    return seen


class SingleTurn:
    """One model step, then the episode is over."""

    def step(self, model_text: str) -> EnvStep:
        return EnvStep(terminated=True)


@dataclass(frozen=True)
class DigitTask:
    """copy or reverse of a digit string: `copy:123=` -> `123`, `rev:123=` -> `321`."""

    kind: Literal["copy", "reverse"] = "copy"
    min_digits: int = 3
    max_digits: int = 3
    reward_kind: RewardKind = "exact"
    stop_markers: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.kind}{self.min_digits}-{self.max_digits}"

    @property
    def marker(self) -> str:
        return "copy:" if self.kind == "copy" else "rev:"

    def make_prompts(self, n: int, seed: int, split: Split = "train") -> list[Prompt]:
        def draw(rng: random.Random) -> str:
            length = rng.randint(self.min_digits, self.max_digits)
            return "".join(rng.choice("0123456789") for _ in range(length))

        space = sum(10**k for k in range(self.min_digits, self.max_digits + 1))
        digits = _draw_unique(n, seed, split, draw, self.name, space)
        return [Prompt(prompt_id=f"{self.name}:{d}", text=f"{self.marker}{d}=",
                       answer=d if self.kind == "copy" else d[::-1]) for d in digits]

    def reward(self, record: Mapping[str, Any], completion_text: str) -> float:
        return score(record["answer"], completion_text, self.reward_kind)

    def demonstration(self, prompt: Prompt) -> str:
        return prompt.answer

    def new_episode(self, prompt: Prompt) -> Episode:
        return SingleTurn()


class _CalculatorEpisode:
    """Model step 1 may end in `</call>`: the tool runs in process and its result is appended.
    A further call past `max_calls` is cut by the environment (truncated, reason "env")."""

    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls
        self.calls = 0

    def step(self, model_text: str) -> EnvStep:
        if not model_text.endswith(END_CALL) or CALL not in model_text:
            return EnvStep(terminated=True)
        if self.calls >= self.max_calls:
            return EnvStep(truncated=True)
        self.calls += 1
        expression = model_text[model_text.rindex(CALL) + len(CALL): -len(END_CALL)]
        try:
            value = str(evaluate(expression))
        except CalculatorError:
            value = ""
        return EnvStep(observation=f"{RESULT}{value}{END_RESULT}")


@dataclass(frozen=True)
class CalculatorTask:
    """Two turns with a tool: `calc:12*34+5=` -> `<call>12*34+5</call>`, the environment appends
    `<result>413</result>`, the model answers `413`. The reward reads the text after the last
    tool result, so answering directly (no call) is allowed and judged the same way."""

    max_operand: int = 99
    terms: int = 2
    reward_kind: RewardKind = "exact"
    max_calls: int = 1
    stop_markers: tuple[str, ...] = (END_CALL,)
    name: str = "calc"

    def make_prompts(self, n: int, seed: int, split: Split = "train") -> list[Prompt]:
        def draw(rng: random.Random) -> str:
            parts = [str(rng.randint(0, self.max_operand))]
            for _ in range(self.terms - 1):
                parts += [rng.choice("+-*"), str(rng.randint(0, self.max_operand))]
            return "".join(parts)

        space = (self.max_operand + 1) ** self.terms * 3 ** (self.terms - 1)
        exprs = _draw_unique(n, seed, split, draw, self.name, space)
        return [Prompt(prompt_id=f"{self.name}:{e}", text=f"calc:{e}=", answer=str(evaluate(e))) for e in exprs]

    @staticmethod
    def final_answer(completion_text: str) -> str:
        if END_RESULT in completion_text:
            return completion_text[completion_text.rindex(END_RESULT) + len(END_RESULT):]
        return completion_text

    def reward(self, record: Mapping[str, Any], completion_text: str) -> float:
        return score(record["answer"], self.final_answer(completion_text), self.reward_kind)

    def demonstration(self, prompt: Prompt) -> str:
        expression = prompt.text[len("calc:"):-1]
        return f"{CALL}{expression}{END_CALL}{RESULT}{prompt.answer}{END_RESULT}{prompt.answer}"

    def new_episode(self, prompt: Prompt) -> Episode:
        return _CalculatorEpisode(self.max_calls)


def get_task(name: str, **kwargs) -> Task:
    """`copy`, `reverse` or `calc`, with the task's settings as keyword arguments."""
    if name in ("copy", "reverse"):
        return DigitTask(kind=name, **kwargs)
    if name == "calc":
        return CalculatorTask(**kwargs)
    raise ValueError(f"unknown task {name!r}: expected copy, reverse or calc")
