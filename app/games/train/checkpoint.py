"""Training checkpoints: one file holding everything needed to continue a run exactly.

A checkpoint is a full, unsharded state (model and optimizer state dicts of the unwrapped
module, step, data position, RNG states, early-stopping state), so any number of processes
can resume it: nothing in it depends on the world size that wrote it. Only rank 0 writes,
to a temp name, fsynced and renamed, so a crash mid-write leaves the previous checkpoint.
Loading uses `torch.load(weights_only=True)`: a checkpoint from a peer can never run code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.atomic_files import replace_durably, temp_sibling

CHECKPOINT_FORMAT = 1


class CheckpointError(RuntimeError):
    """A checkpoint that is missing, unreadable, or belongs to another run; names the path."""


def save_checkpoint(state: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        with open(tmp, "wb") as fh:
            torch.save({"format": CHECKPOINT_FORMAT, **state}, fh)
        replace_durably(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path, required: tuple[str, ...] = ("model", "optimizer", "step")) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: checkpoint not found")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many types for a damaged pickle/zip
        raise CheckpointError(f"{path}: unreadable checkpoint: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path}: not a checkpoint (top level is {type(state).__name__})")
    if int(state.get("format", -1)) > CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: checkpoint format {state.get('format')} is newer than this program's")
    missing = [key for key in required if key not in state]
    if missing:
        raise CheckpointError(f"{path}: checkpoint lacks {', '.join(missing)}")
    return state


def rng_state() -> dict[str, Any]:
    """Torch and NumPy global RNG states in a form `weights_only` loading accepts."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"name": name, "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
                  "pos": int(pos), "has_gauss": int(has_gauss), "cached": float(cached)},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np_state = state["numpy"]
    np.random.set_state((np_state["name"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["cached"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
