"""One reward worker process: `python -m app.lm.reward_worker READ_FD WRITE_FD`.

The parent (reward_pool.py) sends the pickled task first, then one (index, prompt, text) job
at a time, and reads back (index, "ok", value) or (index, "error", why). The worker imports
nothing but what unpickling the task needs, so it starts in a fraction of a second, and it
talks over its own pipes: a reward that prints does not garble the answers. A reward that
hangs is the parent's to kill; one that raises is reported and the worker goes on.

`call_reward` is the one place a task's reward function is called, here and in the inline
scorer: the reward's signature lives in this one line.
"""

from __future__ import annotations

import pickle
import sys
from multiprocessing.connection import Connection
from typing import Any


def call_reward(task: Any, prompt: Any, completion_text: str) -> float:
    """A task's reward of one completion (the task's own signature, in one place)."""
    return task.reward(prompt.record, completion_text)


def serve(requests: Connection, answers: Connection) -> None:
    try:
        task = pickle.loads(requests.recv_bytes())
    except Exception as exc:  # the task's module does not import, or its pickle is broken
        answers.send(("fatal", f"cannot load the reward: {type(exc).__name__}: {exc}"))
        return
    answers.send(("ready", None))
    while True:
        try:
            job = requests.recv()
        except EOFError:
            return
        if job is None:
            return
        index, prompt, text = job
        try:
            answers.send((index, "ok", float(call_reward(task, prompt, text))))
        except Exception as exc:  # the user's reward raised, or returned something float() refuses
            answers.send((index, "error", f"{type(exc).__name__}: {exc}"[:300]))


def main(argv: list[str]) -> int:
    serve(Connection(int(argv[0]), writable=False), Connection(int(argv[1]), readable=False))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
