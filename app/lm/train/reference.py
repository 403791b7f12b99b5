"""The KL reference policy, one way for both runs (generation.py and scripts/sft_rl.py): a
frozen model directory (`lm.grpo.reference`, `--reference`), or, by default, a frozen copy
of the policy that the run then sets to the weights GRPO starts from (sft_grpo.run)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from torch import nn


def reference_model(policy: nn.Module, path: str | Path | None = None,
                    device: torch.device | None = None) -> nn.Module:
    """Frozen, in eval mode, on `device`; a directory's model must take the policy's tokens."""
    if path is None:
        ref = copy.deepcopy(policy)
    else:
        from app.lm.causal_lm import load_model

        ref = load_model(path)
        vocab, want = ref.config.vocab_size, policy.config.vocab_size
        if vocab != want:
            raise ValueError(f"KL reference {path}: vocabulary {vocab}, the policy's is {want}")
    ref = ref.eval().requires_grad_(False)
    return ref.to(device) if device is not None else ref
