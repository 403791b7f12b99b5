"""Where rewards run: off the caller's thread and event loop, in a bounded pool of worker
processes, each call within `timeout_s`.

A task's reward may be slow user code that hangs, raises or returns NaN. Each completion's
reward is one job; `score` hands the jobs of a batch to `workers` processes
(app/lm/reward_worker.py) and answers, per job, a value or a failure reason:

    reward_error      the function raised (or returned something that is not a number), or
                      its worker died, or the reward could not be loaded at all
    reward_nonfinite  it returned NaN or an infinity
    reward_timeout    it took longer than `timeout_s`: its worker is killed and replaced

A failed reward never becomes a number the trainer sees: the sample is marked, and the
rollout filter drops its whole group with that reason (groups.filter_reason), counted in the
metrics, /status and the run's metrics file. The pool itself keeps going, but every scorer
hands its results to its `failures` (app/lm/reward_failures.py): the first line of each
failure in the log at a bounded rate and in /status, and a stop (`RewardFailing`, naming the
function) once the reward failed on every group of `stop_after` batches in a row.

`InlineRewards` is the same contract in the calling thread, without the timeout (no thread
can be stopped): for evaluations of built-in tasks in scripts and tests. Both keep `seconds`,
the wall time spent scoring, which the GRPO step reports as `reward_s`.
"""

from __future__ import annotations

import math
import os
import pickle
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Protocol

import structlog

from app.lm.reward_failures import RewardFailures, reward_label
from app.lm.reward_worker import call_reward

log = structlog.get_logger(__name__)
REWARD_FAILURES = ("reward_error", "reward_nonfinite", "reward_timeout")
START_TIMEOUT_S = 60.0  # a worker importing the reward's module (which may import a lot)


@dataclass(frozen=True)
class Scored:
    value: float | None          # None when the reward failed
    failure: str | None = None   # one of REWARD_FAILURES
    detail: str = ""

    @classmethod
    def of(cls, value: float) -> Scored:
        if not math.isfinite(value):
            return cls(None, "reward_nonfinite", f"returned {value!r}")
        return cls(value)


class RewardScorer(Protocol):
    seconds: float
    failures: RewardFailures

    def score(self, items: Sequence[tuple[Any, str]]) -> list[Scored]: ...  # (prompt, completion text)
    def close(self) -> None: ...


class InlineRewards:
    """The task's reward in the calling thread: errors and non-finite values caught, no timeout."""

    def __init__(self, task: Any, *, stop_after: int = 5) -> None:
        self.task, self.seconds = task, 0.0
        self.failures = RewardFailures(reward_label(task), stop_after=stop_after)

    def score(self, items: Sequence[tuple[Any, str]]) -> list[Scored]:
        self.failures.check()
        started = time.perf_counter()
        out = []
        for prompt, text in items:
            try:
                out.append(Scored.of(float(call_reward(self.task, prompt, text))))
            except Exception as exc:
                out.append(Scored(None, "reward_error", f"{type(exc).__name__}: {exc}"[:300]))
        self.seconds += time.perf_counter() - started
        self.failures.observe(items, out)
        return out

    def close(self) -> None:
        """Nothing to free."""


class _Worker:
    """One `python -m app.lm.reward_worker` process and its two pipes."""

    def __init__(self, task_bytes: bytes) -> None:
        to_child, from_parent = os.pipe()
        to_parent, from_child = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-m", "app.lm.reward_worker", str(to_child), str(from_child)],
                                     pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self.requests = Connection(from_parent, readable=False)
        self.answers = Connection(to_parent, writable=False)
        self.requests.send_bytes(task_bytes)
        self.ready = False
        self.fatal: str | None = None
        self.job: tuple[int, float] | None = None  # (item index, deadline)
        self.started = time.monotonic()

    def send(self, index: int, prompt: Any, text: str, timeout_s: float) -> None:
        self.requests.send((index, prompt, text))
        self.job = (index, time.monotonic() + timeout_s)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        for conn in (self.requests, self.answers):
            conn.close()


class RewardPool:
    """`workers` reward processes for one task; thread-safe (one batch scored at a time)."""

    def __init__(self, task: Any, *, workers: int = 1, timeout_s: float = 10.0, stop_after: int = 5) -> None:
        if workers < 1 or timeout_s <= 0:
            raise ValueError(f"a reward pool needs workers >= 1 and timeout_s > 0, got {workers}, {timeout_s}")
        self.task_bytes = pickle.dumps(task)  # a task that cannot be pickled is refused here, at once
        self.size, self.timeout_s = workers, timeout_s
        self.workers: list[_Worker] = []
        self.seconds = 0.0
        self.restarts = 0
        self.failures = RewardFailures(reward_label(task), stop_after=stop_after)
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the workers now rather than at the first batch: a worker first imports the
        reward's module (seconds for a user's module that imports a lot; 10 s of a 30 s mesh
        generation on two loaded cores), which then overlaps the caller's own start-up."""
        with self._lock:
            while len(self.workers) < self.size:
                self.workers.append(_Worker(self.task_bytes))

    def score(self, items: Sequence[tuple[Any, str]]) -> list[Scored]:
        self.failures.check()
        started = time.perf_counter()
        with self._lock:
            results = self._score(list(items))
        self.seconds += time.perf_counter() - started
        self.failures.observe(items, results)
        return results

    def _score(self, items: list[tuple[Any, str]]) -> list[Scored]:
        results: list[Scored | None] = [None] * len(items)
        todo = deque(range(len(items)))
        while len(self.workers) < self.size:
            self.workers.append(_Worker(self.task_bytes))
        while todo or any(w.job for w in self.workers):
            for w in self.workers:
                if w.ready and w.job is None and todo:
                    index = todo.popleft()
                    w.send(index, *items[index], self.timeout_s)
            self._collect(results, todo)
            if all(w.fatal for w in self.workers):
                why = self.workers[0].fatal or "the reward could not be loaded"
                for index in todo:
                    results[index] = Scored(None, "reward_error", why)
                todo.clear()
                self._replace_all()
        return [r if r is not None else Scored(None, "reward_error", "no answer") for r in results]

    def _collect(self, results: list[Scored | None], todo: deque[int]) -> None:
        """Wait for answers until the nearest deadline; kill and replace workers past theirs."""
        now = time.monotonic()
        deadlines = [w.job[1] if w.job else w.started + START_TIMEOUT_S for w in self.workers if not w.fatal]
        for conn in wait([w.answers for w in self.workers if not w.fatal], max(0.0, min(deadlines, default=now) - now)):
            worker = next(w for w in self.workers if w.answers is conn)
            self._answer(worker, results, todo)
        now = time.monotonic()
        for i, w in enumerate(self.workers):
            if w.fatal:
                continue
            if w.job is not None and now >= w.job[1]:
                results[w.job[0]] = Scored(None, "reward_timeout", f"no answer within timeout_s {self.timeout_s:g}s")
                self._replace(i, "timeout")
            elif not w.ready and now >= w.started + START_TIMEOUT_S:
                w.fatal = f"the reward worker did not start within {START_TIMEOUT_S:g}s"

    def _answer(self, worker: _Worker, results: list[Scored | None], todo: deque[int]) -> None:
        try:
            message = worker.answers.recv()
        except (EOFError, OSError):  # the worker died (os._exit, a crash, the OOM killer)
            if worker.job is not None:
                results[worker.job[0]] = Scored(None, "reward_error", "the reward worker died")
            self._replace(self.workers.index(worker), "died")
            return
        if message[0] == "ready":
            worker.ready = True
        elif message[0] == "fatal":
            worker.fatal = str(message[1])
        else:
            index, kind, payload = message
            results[index] = Scored.of(payload) if kind == "ok" else Scored(None, "reward_error", str(payload))
            worker.job = None

    def _replace(self, i: int, why: str) -> None:
        self.workers[i].kill()
        self.workers[i] = _Worker(self.task_bytes)
        self.restarts += 1
        log.warning("reward_worker_replaced", why=why, restarts=self.restarts)

    def _replace_all(self) -> None:
        for i in range(len(self.workers)):
            self._replace(i, "fatal")

    def close(self) -> None:
        with self._lock:
            for w in self.workers:
                try:
                    w.requests.send(None)
                except OSError:
                    pass
                try:
                    w.proc.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    pass
                w.kill()
            self.workers = []
