"""A task from the user's data: a JSONL prompt file and a reward function (`lm.task.name: jsonl`).

One JSON object a line (blank lines are skipped). A record gives its prompt either as

    {"prompt": "What is 2+3?", "answer": "5"}                       plain text, tokenized as it is
    {"messages": [{"role": "user", "content": "What is 2+3?"}], "answer": "5"}

`messages` are rendered with the tokenizer's chat template (with the generation prompt, so the
model answers as the assistant). Any other fields are the reward's: the whole record is what
`reward(record, completion_text)` gets (app/lm/rewards.py).

SFT's demonstration of a record (what generation 1 of `mode: sft+rl` trains on) is its
`demonstration_field` (`completion` by default); a `messages` record whose last message is the
assistant's has that message as its demonstration instead, and the messages before it as its
prompt (the conversational form TRL's datasets use).

Train and held-out records are split by a hash of the prompt (app/lm/tasks.split_of), as the
built-in tasks are, so the held-out set never shares a prompt with training whatever the seed;
a prompt given twice is kept once (its first record). Every problem is one line naming the
file and the line: a line that is not JSON, a record with neither prompt nor messages, a
record without a field the reward reads, or, when SFT runs, without a demonstration.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.lm.rewards import RewardFn, reward_fields
from app.lm.tasks import Episode, Prompt, Split, SingleTurn, split_of


class PromptFileError(ValueError):
    """A prompt file that cannot be used; one line naming the file (and the line)."""


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, object) of every non-blank line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PromptFileError(f"{path}: prompt file not found (lm.task.path)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(f"{path}: unreadable prompt file: {exc}") from None
    records = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as exc:
            raise PromptFileError(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(record, dict):
            raise PromptFileError(f"{path}:{number}: a record must be a JSON object, not {type(record).__name__}")
        records.append((number, record))
    if not records:
        raise PromptFileError(f"{path}: the prompt file holds no records")
    return records


def _messages(where: str, value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise PromptFileError(f"{where}: messages must be a non-empty list of {{role, content}}")
    for m in value:
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise PromptFileError(f"{where}: each message needs a string role and a string content")
    return value


@dataclass(frozen=True)
class JsonlTask:
    """The prompts of a file, their reward and demonstrations; single-turn episodes."""

    name: str
    path: Path
    reward_fn: RewardFn = field(repr=False)
    prompts: tuple[Prompt, ...] = field(repr=False)
    stop_markers: tuple[str, ...] = ()

    def make_prompts(self, n: int, seed: int, split: Split = "train") -> list[Prompt]:
        """At most `n` prompts of `split`, a seeded choice when the file has more."""
        mine = [p for p in self.prompts if split_of(p.text) == split]
        if not mine:
            raise PromptFileError(f"{self.path}: no {split} prompts among its {len(self.prompts)} "
                                  f"(about a fifth of the prompts are held out)")
        if len(mine) > n:
            random.Random(f"{self.name}:{seed}:{split}").shuffle(mine)
            mine = mine[:n]
        return mine

    def reward(self, record: Mapping[str, Any], completion_text: str) -> float:
        return self.reward_fn(record, completion_text)

    def demonstration(self, prompt: Prompt) -> str:
        return prompt.answer

    def new_episode(self, prompt: Prompt) -> Episode:
        return SingleTurn()


def load_jsonl_task(path: str | Path, reward_fn: RewardFn, tokenizer: Any, *, reward_name: str = "the reward",
                    demonstration_field: str = "completion", need_demonstrations: bool = False) -> JsonlTask:
    """Read and check the whole file (see the module doc); `tokenizer` renders `messages`."""
    path = Path(path)
    needed = reward_fields(reward_fn)
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for number, record in read_jsonl(path):
        where = f"{path}:{number}"
        missing = [f for f in needed if f not in record]
        if missing:
            raise PromptFileError(f"{where}: the record has no {', '.join(map(repr, missing))}, "
                                  f"which {reward_name} reads")
        text, rendered, demo = _prompt_of(where, record, tokenizer, demonstration_field)
        if need_demonstrations and demo is None:
            raise PromptFileError(f"{where}: no demonstration for SFT (a {demonstration_field!r} field, or a final "
                                  f"assistant message); lm.grpo.mode sft+rl trains on one per record")
        if text in seen:
            continue
        seen.add(text)
        prompt_id = f"{path.stem}:{hashlib.sha256(text.encode()).hexdigest()[:16]}"
        prompts.append(Prompt(prompt_id, text, answer=demo or "", record=record, rendered=rendered))
    return JsonlTask(name=f"jsonl:{path.stem}", path=path, reward_fn=reward_fn, prompts=tuple(prompts))


def _prompt_of(where: str, record: dict[str, Any], tokenizer: Any,
               demonstration_field: str) -> tuple[str, bool, str | None]:
    """(prompt text, rendered by the chat template, demonstration or None)."""
    demo = record.get(demonstration_field)
    if demo is not None and not isinstance(demo, str):
        raise PromptFileError(f"{where}: {demonstration_field} must be a string")
    if "messages" in record:
        messages = _messages(where, record["messages"])
        if messages[-1]["role"] == "assistant":
            messages, demo = messages[:-1], messages[-1]["content"]
            if not messages:
                raise PromptFileError(f"{where}: messages hold only the assistant's answer, no prompt")
        if not getattr(tokenizer, "chat_template", None):
            raise PromptFileError(f"{where}: a messages record needs a tokenizer with a chat template, and "
                                  f"this one has none (use prompt, or a tokenizer with chat_template)")
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # a template error is the file's or the template's, named either way
            raise PromptFileError(f"{where}: the chat template failed on these messages: {exc}") from None
        return text, True, demo
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise PromptFileError(f"{where}: a record needs prompt (a non-empty string) or messages (a list of "
                              f"{{role, content}})")
    return prompt, False, demo
