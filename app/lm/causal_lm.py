"""A small Llama causal LM built from a config (random init) or loaded from a local directory.

The defaults give about 75k parameters with the digit tokenizer: big enough to learn copy and
reverse of a few digits on a CPU in minutes, small enough for CI. Input and output embeddings
are tied (the usual choice for small models, and it keeps the count down).
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from app.config.lm import LMModelShape


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


def build_model(cfg: LMModelConfig, tokenizer: PreTrainedTokenizerBase) -> LlamaForCausalLM:
    """Random init from `cfg.seed`, without touching the caller's global RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = LlamaForCausalLM(llama_config(cfg, tokenizer))
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Distinct parameters (tied weights counted once)."""
    return sum(p.numel() for p in model.parameters())


def save_model(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, directory: str | Path) -> Path:
    """`save_pretrained` (safetensors) of model and tokenizer into one directory."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory), safe_serialization=True)
    tokenizer.save_pretrained(str(directory))
    return directory


def load_model(directory: str | Path, dtype: torch.dtype = torch.float32) -> LlamaForCausalLM:
    """Load from a local directory only (never the hub); a missing config is an error naming it."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no config.json in {directory}")
    hf_logging.disable_progress_bar()  # a node loads each promoted model: no tqdm bar in its log
    model = LlamaForCausalLM.from_pretrained(str(directory), local_files_only=True, dtype=dtype)
    model.eval()
    return model
