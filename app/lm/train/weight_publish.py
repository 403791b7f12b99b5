"""How the online loop's trained weights reach its engine after a step: one WeightUpdate per
version, with the full tensors (from a provider: the backend's weights by default; LoRA hands
merged ones) and, when the engine loads from disk, a `save_pretrained` directory of them.

The provider is called once per version on the calling thread (under FSDP it is a collective
that every rank must join), never inside an engine's load. Directories are written under a
staging name and renamed whole, `keep` of them at a time.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from app.lm.rollout.engine import WeightUpdate
from app.lm.train.hf_io import write_pretrained

WeightsFn = Callable[[], Mapping[str, torch.Tensor]]


class WeightPublisher:
    def __init__(self, weights: WeightsFn, *, model: nn.Module | None = None, tokenizer: Any = None,
                 out_dir: str | Path | None = None, keep: int = 2, writer: bool = True) -> None:
        """`out_dir` (with `model`, whose architecture the directory records): write directories
        for engines that load from disk; `writer`: this rank writes them (rank 0)."""
        if out_dir is not None and model is None:
            raise ValueError("writing weight directories needs the model (its config and class)")
        self.weights, self.model, self.tokenizer = weights, model, tokenizer
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.keep, self.writer = max(1, keep), writer

    def __call__(self, version: int) -> WeightUpdate:
        tensors = dict(self.weights())
        path = self._write(version, tensors) if self.out_dir is not None else None
        return WeightUpdate(version=version, path=path, tensors=lambda: tensors)

    def _write(self, version: int, tensors: dict[str, torch.Tensor]) -> Path:
        assert self.out_dir is not None and self.model is not None
        final = self.out_dir / f"step_{version}"
        if self.writer:
            staging = self.out_dir / f".staging-step_{version}"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir(parents=True)
            write_pretrained(self.model, {k: v.detach().cpu() for k, v in tensors.items()}, staging, self.tokenizer)
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
            published = sorted((p for p in self.out_dir.glob("step_*") if p.name[5:].lstrip("-").isdigit()),
                               key=lambda p: int(p.name[5:]))
            for old in published[:-self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return final
