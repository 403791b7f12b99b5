"""A reward that fails is seen: what each reward scorer keeps of its failures.

A failed reward drops its sample's group (groups.filter_reason), which alone would leave a
broken reward invisible: the run goes on, `/status` shows a count, the exception text is
nowhere. So each scorer (app/lm/reward_pool.py) hands every batch it scored to one
`RewardFailures`, which

- logs the first line of each failure (`reward_failed`), at most one line per `log_every_s`
  per distinct first line, with the number left out since, so a reward failing on every
  completion cannot flood the log;
- keeps, bounded, the distinct first lines with their counts and the failures by kind, for
  `/status` and the run's metrics (`snapshot`);
- stops the workload when the reward failed on EVERY group of `stop_after` scored batches in
  a row (a batch is one scoring call: one rollout round of the online loop, one self-play
  batch on the mesh): `RewardFailing`, naming the function and its last error. From then on
  every call raises it again, so a mesh daemon that restarts cannot go on with it. 0: never.

A group counts as failed when any of its completions failed, as the filter drops it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

import structlog

log = structlog.get_logger(__name__)
KEEP_LINES = 8  # distinct first lines kept for /status
LINE_CHARS = 200


class RewardFailing(RuntimeError):
    """The reward failed on every group of `stop_after` scored batches in a row."""


def reward_label(task: Any) -> str:
    """The reward function as a user would find it: `module:qualname` of a JSONL task's function
    (or the class of a built reward object), else the task's own `reward` method."""
    fn = getattr(task, "reward_fn", None)
    if fn is not None:
        target = fn if hasattr(fn, "__qualname__") else type(fn)
        return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(fn).__name__)}"
    return f"{type(task).__name__}.reward of task {getattr(task, 'name', '?')!r}"


def first_line(detail: str) -> str:
    lines = [x.strip() for x in str(detail).strip().splitlines() if x.strip()]
    return (lines[0] if lines else "(no message)")[:LINE_CHARS]


class RewardFailures:
    """Failures of one reward function (thread-safe: self-play and evaluation share a pool)."""

    def __init__(self, reward: str, *, stop_after: int = 5, log_every_s: float = 30.0) -> None:
        self.reward, self.stop_after, self.log_every_s = reward, stop_after, log_every_s
        self.by_kind: Counter[str] = Counter()
        self.lines: OrderedDict[str, int] = OrderedDict()  # first line -> count, most recent last
        self.failed_batches_in_a_row = 0
        self.stopped: str | None = None
        self._logged: dict[str, tuple[float, int]] = {}  # first line -> (last logged at, left out since)
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise the stop again once it happened."""
        if self.stopped is not None:
            raise RewardFailing(self.stopped)

    def observe(self, items: Sequence[tuple[Any, str]], results: Sequence[Any]) -> None:
        """One scored batch: `items` (prompt, text) and their `Scored` results, in order."""
        groups: dict[str, bool] = {}
        with self._lock:
            for (prompt, _), scored in zip(items, results):
                key = str(getattr(prompt, "prompt_id", id(prompt)))
                failed = scored.failure is not None
                groups[key] = groups.get(key, False) or failed
                if failed:
                    self._note(scored.failure, first_line(scored.detail or scored.failure))
            if not groups:
                return
            if all(groups.values()):
                self.failed_batches_in_a_row += 1
            else:
                self.failed_batches_in_a_row = 0
            if self.stop_after and self.failed_batches_in_a_row >= self.stop_after and self.stopped is None:
                last = next(reversed(self.lines)) if self.lines else "?"
                self.stopped = (f"reward {self.reward} failed on every group of {self.failed_batches_in_a_row} "
                                f"scored batches in a row (lm.reward_pool.stop_after_failed_batches "
                                f"{self.stop_after}); last error: {last}")
                log.error("reward_failing_stop", reward=self.reward, message=self.stopped)
        self.check()

    def _note(self, kind: str, line: str) -> None:
        self.by_kind[kind] += 1
        self.lines[line] = self.lines.pop(line, 0) + 1
        while len(self.lines) > KEEP_LINES:
            self.lines.popitem(last=False)
        now = time.monotonic()
        last, left_out = self._logged.get(line, (-float("inf"), 0))
        if now - last >= self.log_every_s:
            log.warning("reward_failed", reward=self.reward, kind=kind, error=line, left_out_since=left_out)
            self._logged[line] = (now, 0)
            if len(self._logged) > 4 * KEEP_LINES:  # bounded: forget the oldest
                self._logged.pop(next(iter(self._logged)))
        else:
            self._logged[line] = (last, left_out + 1)

    def snapshot(self) -> dict[str, Any]:
        """For /status and metrics: counts by kind, the recent distinct first lines, the stop."""
        with self._lock:
            return {"reward": self.reward, "failures": dict(self.by_kind),
                    "recent": [{"error": line, "count": n} for line, n in reversed(self.lines.items())],
                    "failed_batches_in_a_row": self.failed_batches_in_a_row, "stopped": self.stopped}
