"""The durable record of the rollout groups a GRPO run has trained on: no group uid is trained twice.

A checkpoint restores the weights and the rollout buffer of step N; the groups a killed run
took in steps N+1.. are in this record already (each step's uids are appended and fsynced
before the step trains), so the resumed run does not take them again: what a kill -9 costs
is at most the groups of the steps after the newest checkpoint, never a group trained twice
(the rule of slime's and AReaL's buffers). A group produced again after the resume with the
same uid (the in-process loop replays its seeds) is dropped as "consumed" and replaced.

    <run_dir>/consumed/rank_<r>.jsonl   one line per step: {"step": N, "uids": [...]}; first, for
                                        the run of a trainer that stays, {"step": 0, "uids": [...],
                                        "carried": true}: what its last run read of the policies
                                        this one inherits (policy_publish.py), never trained here

One file per rank: each rank trains its own groups (rollout_sources.GeneratedGroups), and
appends are never shared between processes. A torn last line (a kill in the middle of the
append) is ignored, as its step never trained; any other unreadable line refuses the run,
naming the file and line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

DIR_NAME = "consumed"


class ConsumedRecordError(RuntimeError):
    """The record cannot be read: trusting it partly could train a group twice."""


class ConsumedGroups:
    """The uids trained so far by this rank of the run in `run_dir` (all of them: the set is
    bounded by the run's steps times its groups a step)."""

    def __init__(self, run_dir: str | Path, rank: int = 0) -> None:
        self.path = Path(run_dir) / DIR_NAME / f"rank_{rank:05d}.jsonl"
        self.uids: set[str] = set()
        self.steps = 0  # lines read or written
        if self.path.is_file():
            self._load()

    def _load(self) -> None:
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        good = 0  # bytes of whole, readable lines
        for number, text in enumerate(lines, 1):
            if not text and number == len(lines):
                break  # after the final newline
            try:
                entry = json.loads(text)
                uids = entry["uids"]
                if not isinstance(uids, list) or not all(isinstance(u, str) for u in uids):
                    raise ValueError("uids is not a list of strings")
            except (ValueError, KeyError, TypeError) as exc:
                if number == len(lines):  # torn by a kill while appended: that step never trained
                    with open(self.path, "r+b") as fh:
                        fh.truncate(good)  # so the next append starts a line of its own
                    break
                raise ConsumedRecordError(f"{self.path} line {number}: {exc}") from None
            self.uids.update(uids)
            self.steps += 1
            good += len(text) + 1

    def __contains__(self, uid: object) -> bool:
        return uid in self.uids

    def __len__(self) -> int:
        return len(self.uids)

    def repeated(self, uids: Iterable[str]) -> list[str]:
        """Which of `uids` were trained already (or appear twice among themselves)."""
        seen: set[str] = set()
        out = []
        for uid in uids:
            if uid in self.uids or uid in seen:
                out.append(uid)
            seen.add(uid)
        return out

    def carry(self, uids: Iterable[str]) -> None:
        """Record uids trained (or dropped) by the run whose policies this one inherits, so that
        neither this run nor its resume after a kill takes them again; durable as a step's."""
        new = sorted(set(uids) - self.uids)
        if new:
            self._append({"step": 0, "uids": new, "carried": True})
            self.uids.update(new)

    def record(self, step: int, uids: Sequence[str]) -> None:
        """Append the step's uids, durably, before the step trains on them. A repeat is a bug
        upstream (the filters let it through): refused here rather than trained."""
        again = self.repeated(uids)
        if again:
            raise ConsumedRecordError(f"step {step}: group(s) {again[:3]} were trained already ({self.path})")
        self._append({"step": step, "uids": list(uids)})
        self.uids.update(uids)
        self.steps += 1

    def _append(self, entry: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
