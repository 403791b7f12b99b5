"""Rewards as code the user owns: `reward(record, completion_text) -> float`.

A reward is a pure function of the prompt file's record (the JSON object the prompt came
from, with whatever fields it needs, e.g. `answer`) and the completion's text. The config
names it (`lm.task.reward`): a built-in name, or an import path `package.module:function`;
a class at that path is built with the term's `args` and then called; a function gets
`args` as keyword arguments. Several terms make a weighted sum.

    reward: math                                          # one built-in
    reward: my_pkg.rewards:judge                          # the user's function
    reward:                                               # a weighted sum
      - {fn: math, weight: 1.0}
      - {fn: format, weight: 0.2, args: {pattern: '^\\d+$'}}

A reward may say which record fields it reads with a `fields` attribute (a tuple of names);
the prompt file is checked against it when it is loaded, so a record missing one is refused
with its line number rather than failing mid-rollout. Loading problems are one line naming
the key and the path (`RewardLoadError`). Running them (a pool, a timeout, what a raising or
non-finite reward does to its group) is the rollout's business, not this module's.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

RewardFn = Callable[[Mapping[str, Any], str], float]
KEY = "lm.task.reward"


class RewardLoadError(ValueError):
    """A reward that cannot be named, imported or built; one line naming the key and the path."""


@dataclass(frozen=True)
class ExactMatch:
    """1.0 when the completion is the record's `field` (both stripped of surrounding space)."""

    field: str = "answer"

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    def __call__(self, record: Mapping[str, Any], completion_text: str) -> float:
        return float(completion_text.strip() == str(record[self.field]).strip())


_NUMBER = re.compile(r"-?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:/\d+)?")


def _boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def _to_number(text: str) -> float | None:
    text = text.replace(",", "").strip()
    try:
        if "/" in text:
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError):
        return None


def extract_number(text: str) -> float | None:
    """The answer a text gives: what its last `\\boxed{}` holds, else its last number
    (`1,234`, `-3.5` and `3/4` read as numbers), else None."""
    boxed = _boxed(text)
    if boxed is not None:
        text = boxed
    found = _NUMBER.findall(text)
    return _to_number(found[-1]) if found else None


@dataclass(frozen=True)
class MathAnswer:
    """1.0 when the completion's answer (`extract_number`) equals the record's `field`
    numerically, within `tolerance` relative to the larger of 1 and the expected value."""

    field: str = "answer"
    tolerance: float = 1e-6

    @property
    def fields(self) -> tuple[str, ...]:
        return (self.field,)

    def __call__(self, record: Mapping[str, Any], completion_text: str) -> float:
        expected = extract_number(str(record[self.field]))
        got = extract_number(completion_text)
        if expected is None or got is None:
            return 0.0
        return float(abs(got - expected) <= self.tolerance * max(1.0, abs(expected)))


@dataclass(frozen=True)
class FormatReward:
    """1.0 when the completion has the expected form: `pattern` (a regular expression) found
    in it, or matching all of it with `whole`. The default asks for a `\\boxed{}` answer."""

    pattern: str = r"\\boxed\{[^{}]+\}"
    whole: bool = False
    fields: ClassVar[tuple[str, ...]] = ()  # reads the completion only

    def __post_init__(self) -> None:
        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern {self.pattern!r}: {exc}") from None

    def __call__(self, record: Mapping[str, Any], completion_text: str) -> float:
        text = completion_text.strip()
        found = re.fullmatch(self.pattern, text) if self.whole else re.search(self.pattern, text)
        return float(found is not None)


@dataclass(frozen=True)
class WeightedSum:
    """sum(weight * term(record, completion)); reads the union of its terms' fields."""

    terms: tuple[tuple[RewardFn, float], ...]

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(f for fn, _ in self.terms for f in reward_fields(fn)))

    def __call__(self, record: Mapping[str, Any], completion_text: str) -> float:
        return sum(weight * float(fn(record, completion_text)) for fn, weight in self.terms)


BUILTINS: dict[str, type] = {"exact_match": ExactMatch, "math": MathAnswer, "format": FormatReward}


def reward_fields(fn: RewardFn) -> tuple[str, ...]:
    """The record fields a reward says it reads (none when it does not say)."""
    fields = getattr(fn, "fields", ())
    return (fields,) if isinstance(fields, str) else tuple(fields)


def import_object(path: str, key: str = KEY) -> Any:
    """`package.module:attribute` (the attribute may be dotted) -> the object."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise RewardLoadError(f"{key}: {path!r} is neither a built-in ({', '.join(BUILTINS)}) "
                              f"nor an import path package.module:function")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the user's module may fail in any way while it imports
        raise RewardLoadError(f"{key}: cannot import module {module_name!r} of {path!r}: "
                              f"{type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise RewardLoadError(f"{key}: {path!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                                  f"{part!r}")
        obj = getattr(obj, part)
    return obj


def build_term(fn: str, args: Mapping[str, Any] | None = None, key: str = KEY) -> RewardFn:
    """One reward from its name or import path: a class is built with `args`, a function gets
    them as keyword arguments."""
    target = BUILTINS.get(fn) or import_object(fn, key)
    args = dict(args or {})
    if isinstance(target, type):
        try:
            built = target(**args)
        except Exception as exc:
            raise RewardLoadError(f"{key}: {fn} with args {args}: {type(exc).__name__}: {exc}") from None
        if not callable(built):
            raise RewardLoadError(f"{key}: {fn} builds a {type(built).__name__}, which is not callable")
        return built
    if not callable(target):
        raise RewardLoadError(f"{key}: {fn} is a {type(target).__name__}, not a function or class")
    if not args:
        return target
    wrapped = functools.partial(target, **args)
    if hasattr(target, "fields"):
        wrapped.fields = target.fields  # type: ignore[attr-defined]
    return wrapped


def load_reward(spec: str | Sequence[Any], key: str = KEY) -> RewardFn:
    """The reward a config names: one term (a string), or the weighted sum of a list of terms
    (each with `fn`, `weight` and `args`, as app/config/lm.py's RewardTerm)."""
    if isinstance(spec, str):
        return build_term(spec, key=key)
    terms = []
    for i, term in enumerate(spec):
        fn, weight, args = (term["fn"], term.get("weight", 1.0), term.get("args")) if isinstance(term, Mapping) \
            else (term.fn, term.weight, term.args)
        if not math.isfinite(weight):
            raise RewardLoadError(f"{key}[{i}]: weight {weight} is not a finite number")
        terms.append((build_term(fn, args, f"{key}[{i}]"), float(weight)))
    if len(terms) == 1 and terms[0][1] == 1.0:
        return terms[0][0]
    return WeightedSum(tuple(terms))


def reward_name(spec: str | Sequence[Any]) -> str:
    """A short name of a reward spec, for messages."""
    if isinstance(spec, str):
        return spec
    return "+".join(term["fn"] if isinstance(term, Mapping) else term.fn for term in spec)
