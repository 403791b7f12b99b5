"""Whole-model exports: the full training state, Hugging Face directories, and their loaders.

Gathering whole tensors from FSDP shards is a collective: EVERY rank calls `save_full_state`
and `save_hf`; rank 0 alone writes, into a staging directory renamed into place, and then all
ranks wait at a barrier, so no rank reads a directory rank 0 is still writing.
`save_pretrained` writes safetensors, split into `model-0000k-of-0000n.safetensors` with a
`model.safetensors.index.json` once the model exceeds `max_shard_size`. `load_weight_files`
reads the four layouts found in the wild: `model.safetensors`, a sharded safetensors index,
`pytorch_model.bin` and a sharded bin index (bin files with `weights_only=True`: a file from
elsewhere can never run code).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn
from torch.distributed.fsdp import FSDPModule

from app.atomic_files import replace_durably, temp_sibling
from app.lm.lora import base_model, merged_weights
from app.lm.train.backend import TrainingBackend
from app.lm.train.checkpoint_dirs import commit_dir, fresh_staging

FULL_STATE_NAME = "full_state.pt"
SAFE_SINGLE, SAFE_INDEX = "model.safetensors", "model.safetensors.index.json"
BIN_SINGLE, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


class WeightsFormatError(RuntimeError):
    """A model directory with no weights we can read, or a damaged weights file; names the path."""


def _full_state(backend: TrainingBackend) -> dict[str, Any]:
    getter = getattr(backend, "full_state", None)
    if getter is None:
        raise TypeError(f"{type(backend).__name__} cannot gather a full state")
    return getter()


def save_full_state(backend: TrainingBackend, path: str | Path, extra: dict[str, Any] | None = None) -> Path:
    """Whole model + whole optimizer state in one file (torch.save) written by rank 0. Collective."""
    path = Path(path)
    state = _full_state(backend)  # every rank joins the gather
    if backend.rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_sibling(path)
        try:
            with open(tmp, "wb") as fh:
                torch.save({**state, **(extra or {})}, fh)
            replace_durably(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    backend.barrier()
    return path


def load_full_state(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise WeightsFormatError(f"{path}: full state not found") from None
    except Exception as exc:  # damaged zip/pickle
        raise WeightsFormatError(f"{path}: unreadable full state: {type(exc).__name__}: {exc}") from None


def write_pretrained(model: nn.Module, weights: dict[str, torch.Tensor], directory: Path,
                     tokenizer: Any = None, max_shard_size: int | str = "5GB") -> None:
    """`save_pretrained` of `weights` in the architecture of `model`, built on the meta device
    so no second full-size copy is allocated."""
    # FSDP2 swaps a module's class for a subclass of (FSDPModule, original): build the original.
    cls = next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))
    with torch.device("meta"):
        shell = cls(model.config)
    shell.load_state_dict(weights, strict=False, assign=True)
    if hasattr(shell, "tie_weights"):
        shell.tie_weights()
    shell.save_pretrained(str(directory), max_shard_size=max_shard_size)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))


def save_hf(backend: TrainingBackend, root: str | Path, name: str, tokenizer: Any = None,
            max_shard_size: int | str = "5GB", metadata: dict[str, Any] | None = None) -> Path:
    """A Hugging Face directory `root/name` (LoRA merged), appearing whole (rename after a
    COMPLETE marker). Collective."""
    root = Path(root)
    weights = _full_state(backend)["model"]
    if backend.rank == 0:
        staging = fresh_staging(root, name)
        write_pretrained(base_model(backend.model), merged_weights(backend.model, weights), staging, tokenizer,
                         max_shard_size)
        commit_dir(staging, root, name, {"name": name, **(metadata or {})}, update_latest=False)
    backend.barrier()
    return root / name


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(str(path))
    except Exception as exc:
        raise WeightsFormatError(f"{path}: unreadable safetensors file: {type(exc).__name__}: {exc}") from None


def _read_bin(path: Path) -> dict[str, torch.Tensor]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise WeightsFormatError(f"{path}: unreadable weights file: {type(exc).__name__}: {exc}") from None
    if not isinstance(state, dict):
        raise WeightsFormatError(f"{path}: not a state dict (top level is {type(state).__name__})")
    return state


def _read_index(index: Path, reader) -> dict[str, torch.Tensor]:
    try:
        weight_map: dict[str, str] = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WeightsFormatError(f"{index}: unreadable shard index: {exc}") from None
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard:
            raise WeightsFormatError(f"{index}: shard name {shard!r} leaves the directory")
        if not (index.parent / shard).is_file():
            raise WeightsFormatError(f"{index.parent / shard}: shard named by {index.name} is missing")
        out.update(reader(index.parent / shard))
    missing = sorted(set(weight_map) - set(out))
    if missing:
        raise WeightsFormatError(f"{index}: tensors missing from their shards: {', '.join(missing[:5])}")
    return out


def load_weight_files(directory: str | Path) -> dict[str, torch.Tensor]:
    """The state dict stored in a model directory, whichever of the four layouts it uses."""
    directory = Path(directory)
    if (directory / SAFE_INDEX).is_file():
        return _read_index(directory / SAFE_INDEX, _read_safetensors)
    if (directory / SAFE_SINGLE).is_file():
        return _read_safetensors(directory / SAFE_SINGLE)
    if (directory / BIN_INDEX).is_file():
        return _read_index(directory / BIN_INDEX, _read_bin)
    if (directory / BIN_SINGLE).is_file():
        return _read_bin(directory / BIN_SINGLE)
    raise WeightsFormatError(f"{directory}: no {SAFE_SINGLE}, {SAFE_INDEX}, {BIN_SINGLE} or {BIN_INDEX}")
