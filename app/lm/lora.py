"""LoRA (`lm.lora`) with peft: adapters train, the base weights stay frozen, and everything
outside the trainer sees plain merged weights.

`with_lora` wraps a model in peft's `PeftModel` (the adapters' random init is seeded, so every
FSDP rank builds the same one). Whatever leaves the trainer is a plain model of the base
architecture: `merged_weights` turns a PeftModel's state dict (`...q_proj.base_layer.weight`,
`...q_proj.lora_A.default.weight`, ...) into the base model's names with each adapted weight
replaced by W + scaling * (B @ A), from the gathered tensors alone, so it works the same on a
sharded model (whose full state dict was gathered first) and on one process. The backends'
`get_weights` (what the in-process engine and the KL reference load) and the candidate
directory (what the mesh promotes and HTTP engines load from disk) both go through it; the
adapter itself is saved beside the candidate (`save_adapter`, peft's file layout).

peft is imported only where adapters are made (`with_lora`) or read (a PeftModel's weights):
a model without adapters never needs it, and every LM process (node, rank) would pay its import
(~0.3 CPU s) for nothing. Until `with_lora` imported it, no model can be a PeftModel.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors.torch import save_file
from torch import nn

from app.config.lm import LMLoRASettings

ADAPTER = "default"  # peft's name of the one adapter
PREFIX = "base_model.model."  # what PeftModel puts before the base model's names

if TYPE_CHECKING:
    from peft import PeftModel


def with_lora(model: nn.Module, cfg: LMLoRASettings, seed: int = 0) -> PeftModel:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout, bias="none",
                        target_modules=cfg.target_modules, task_type="CAUSAL_LM")
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # peft asks transformers a deprecated name
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def is_lora(model: nn.Module) -> bool:
    peft = sys.modules.get("peft")
    return peft is not None and isinstance(model, peft.PeftModel)


def base_model(model: nn.Module) -> nn.Module:
    """The model of the base architecture (what a merged checkpoint is an instance of)."""
    return model.get_base_model() if is_lora(model) else model


def _plain_name(key: str) -> str:
    return key.removeprefix(PREFIX).replace(".base_layer.", ".")


def merged_weights(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state` (the model's full state dict) as the base model's weights with the adapters merged;
    `state` itself when the model has no adapters."""
    if not is_lora(model):
        return state
    from peft.tuners.lora import LoraLayer

    layers = {name: module for name, module in model.named_modules() if isinstance(module, LoraLayer)}
    out = {_plain_name(k): v for k, v in state.items() if ".lora_" not in k}
    for name, layer in layers.items():
        a, b = state[f"{name}.lora_A.{ADAPTER}.weight"], state[f"{name}.lora_B.{ADAPTER}.weight"]
        delta = (b.float() @ a.float()) * float(layer.scaling[ADAPTER])
        if getattr(layer, "fan_in_fan_out", False):  # GPT-2's Conv1D keeps its weight transposed
            delta = delta.T
        key = _plain_name(f"{name}.base_layer.weight")
        out[key] = (out[key].float() + delta).to(out[key].dtype)
    return out


def adapter_state(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a full state dict, named as peft saves them."""
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(model, state_dict=state, adapter_name=ADAPTER)


def save_adapter(model: nn.Module, state: dict[str, torch.Tensor], directory: Path) -> Path:
    """peft's layout: adapter_config.json + adapter_model.safetensors (PeftModel.from_pretrained reads it)."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in adapter_state(model, state).items()}
    save_file(tensors, str(directory / "adapter_model.safetensors"), metadata={"format": "pt"})
    model.peft_config[ADAPTER].save_pretrained(str(directory))
    return directory


def trainable_count(model: nn.Module) -> dict[str, Any]:
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"trainable": trainable, "total": sum(p.numel() for p in model.parameters())}
