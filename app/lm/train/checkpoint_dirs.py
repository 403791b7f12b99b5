"""Checkpoint directories that appear whole or not at all, and which one to resume from.

    <root>/step_00000040/dcp/...            DCP shards of model + optimizer (any world size reads them)
    <root>/step_00000040/trainer_state.json step, data buffer, phase, run settings
    <root>/step_00000040/COMPLETE           the marker, written last (JSON: step, world size)
    <root>/latest                           "step_00000040", replaced atomically after the rename

Everything is written under `<root>/.staging-step_...`, then the marker, then one rename of
the directory and a directory fsync: a reader sees no directory, or a complete one. The
`latest` pointer is written (temp + rename) only after that. `newest_complete` does not trust
the pointer alone: it compares the step numbers of directories as integers and requires the
marker, so a torn copy or a directory someone renamed by hand is never picked.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json, atomic_write_text, fsync_dir
from app.lm.train.backend import TrainingBackend

COMPLETE = "COMPLETE"
PHASE_DIRS = ("sft", "rl")  # a run dir's checkpoint dirs, one per phase (sft_grpo.py, continuation.py)
LATEST = "latest"
STATE_NAME = "trainer_state.json"
_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointDirError(RuntimeError):
    """A checkpoint directory that is missing, incomplete or unreadable; names the path."""


def step_dir_name(step: int) -> str:
    return f"step_{step:08d}"


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first (integer order)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _STEP_DIR.match(path.name)
        if match and path.is_dir() and (path / COMPLETE).is_file():
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_complete(root: str | Path) -> tuple[int, Path] | None:
    found = complete_checkpoints(root)
    return found[-1] if found else None


def read_latest(root: str | Path) -> Path | None:
    """Where `latest` points, if it names a complete checkpoint."""
    pointer = Path(root) / LATEST
    if not pointer.is_file():
        return None
    target = Path(root) / pointer.read_text(encoding="utf-8").strip()
    return target if (target / COMPLETE).is_file() else None


def commit_dir(staging: Path, root: Path, name: str, marker: dict[str, Any], update_latest: bool = True) -> Path:
    """Marker into `staging`, one rename to `root/name`, then the `latest` pointer."""
    atomic_write_json(staging / COMPLETE, marker)
    fsync_dir(staging)
    final = root / name
    old = root / f".old-{name}"
    if final.exists():  # the same step saved again: swap, then drop the old copy
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    staging.rename(final)
    fsync_dir(root)
    shutil.rmtree(old, ignore_errors=True)
    if update_latest:
        atomic_write_text(root / LATEST, name)
    return final


def fresh_staging(root: Path, name: str) -> Path:
    staging = root / f".staging-{name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    return staging


def prune_older(root: Path, keep: int) -> list[Path]:
    """Rank 0, after a commit: every complete checkpoint but the newest `keep` removed (0: none
    removed). A model's checkpoint is its weights and the optimizer's moments (~3x the model),
    so a run that kept one every `checkpoint_every` steps, on every generation, filled the disk;
    resuming needs only the newest, which a commit makes before anything older goes."""
    if keep <= 0:
        return []
    gone = [path for _, path in complete_checkpoints(root)[:-keep]]
    for path in gone:
        shutil.rmtree(path, ignore_errors=True)
    return gone


def save_training_checkpoint(backend: TrainingBackend, root: str | Path, step: int,
                             trainer_state: dict[str, Any], keep: int = 1) -> Path:
    """Every rank calls this (DCP is a collective); rank 0 alone stages, commits and points,
    then keeps the newest `keep` complete checkpoints (0: all)."""
    root = Path(root)
    name = step_dir_name(step)
    staging = root / f".staging-{name}"
    if backend.rank == 0:
        fresh_staging(root, name)
    backend.barrier()
    backend.save_checkpoint(staging / "dcp")
    backend.barrier()
    if backend.rank == 0:
        atomic_write_json(staging / STATE_NAME, {**trainer_state, "step": step})
        commit_dir(staging, root, name, {"step": step, "world_size": backend.world_size})
        prune_older(root, keep)
    backend.barrier()
    return root / name


def read_trainer_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not (path / COMPLETE).is_file():
        raise CheckpointDirError(f"{path}: not a complete checkpoint (no {COMPLETE} marker)")
    try:
        return json.loads((path / STATE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointDirError(f"{path / STATE_NAME}: unreadable trainer state: {exc}") from None


def load_training_checkpoint(backend: TrainingBackend, path: str | Path) -> dict[str, Any]:
    """Model and optimizer into `backend` (at any world size); returns the trainer state."""
    state = read_trainer_state(path)
    backend.load_checkpoint(Path(path) / "dcp")
    return state
