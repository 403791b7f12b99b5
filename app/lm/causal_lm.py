"""Causal LMs: any local Hugging Face directory, or a small Llama built from a shape.

`load_model` reads any causal-LM directory with `AutoModelForCausalLM` (its config.json names
the architecture: Llama, Qwen2, GPT-2, ...), from local files only: nothing is ever downloaded,
and a path that is not a local directory (a hub name, a typo) is refused in one line that says
so (`ModelLoadError`). `build_model` makes the random-init Llama of the built-in toy tasks: the
defaults give about 75k parameters with the digit tokenizer, big enough to learn copy and
reverse of a few digits on a CPU in minutes. Input and output embeddings are tied.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from app.config.lm import LMModelShape

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
_HUB_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")  # "gpt2", "Qwen/Qwen2.5-0.5B"


class ModelLoadError(ValueError):
    """A model directory that cannot be loaded; one line naming the path (and the config key)."""


class LMModelConfig(LMModelShape):
    """The shape of the model (the `lm.model` section's, app/config/lm.py) and its vocabulary:
    `vocab_size=None` takes the tokenizer's size."""

    vocab_size: int | None = None


def llama_config(cfg: LMModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaConfig:
    vocab = cfg.vocab_size if cfg.vocab_size is not None else len(tokenizer)
    if vocab < len(tokenizer):
        raise ValueError(f"vocab_size {vocab} is smaller than the tokenizer's {len(tokenizer)} tokens")
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.layers,
        num_attention_heads=cfg.heads,
        num_key_value_heads=cfg.kv_heads,
        intermediate_size=cfg.intermediate,
        max_position_embeddings=cfg.max_position,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        attn_implementation=cfg.attn_implementation,
    )


def build_model(cfg: LMModelConfig, tokenizer: PreTrainedTokenizerBase,
                dtype: str | torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Random init from `cfg.seed`, without touching the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(llama_config(cfg, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.to(DTYPES[dtype] if isinstance(dtype, str) else dtype)


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """`save_pretrained` (safetensors) of model and tokenizer into one directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def check_model_dir(directory: str | Path, key: str = "lm.model.path", needs: str = "config.json") -> Path:
    """`directory` as a local Hugging Face directory holding `needs`, or a ModelLoadError."""
    path = Path(directory)
    if not path.exists():
        hint = (" and looks like a Hugging Face hub name" if _HUB_NAME.fullmatch(str(directory)) else "")
        raise ModelLoadError(f"{key}: {directory} is not a local directory{hint}; nothing is downloaded: "
                             f"fetch the checkpoint yourself (e.g. huggingface-cli download NAME --local-dir DIR) "
                             f"and give DIR")
    if not path.is_dir():
        raise ModelLoadError(f"{key}: {directory} is a file, not a model directory")
    if not (path / needs).is_file():
        raise ModelLoadError(f"{key}: {directory} has no {needs}: not a Hugging Face model directory")
    return path


def load_model(directory: str | Path, dtype: str | torch.dtype = torch.float32, *, key: str = "lm.model.path",
               attn_implementation: str | None = None) -> PreTrainedModel:
    """Any causal LM from a local directory (never the hub), in eval mode."""
    path = check_model_dir(directory, key)
    hf_logging.disable_progress_bar()  # a node loads each promoted model: no tqdm bar in its log
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    extra = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch_dtype, **extra)
    except (OSError, ValueError, KeyError) as exc:  # an unknown architecture, unreadable weights
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelLoadError(f"{key}: {directory}: cannot load a causal LM: {first}") from None
    model.eval()
    return model
