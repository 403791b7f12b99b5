"""The 2-core demo's model, built offline: a byte-level BPE tokenizer trained here with the
`tokenizers` library, a small causal LM of a stock architecture (Qwen2 by default) with random
weights, both written with `save_pretrained`, and an arithmetic prompt file (JSONL).

Nothing is downloaded: the tokenizer learns its merges from text generated here (arithmetic
questions in the chat format, and a few sentences), so the same call always builds the same
files. The directory it writes is loaded exactly as a downloaded checkpoint would be
(`AutoModelForCausalLM` / `AutoTokenizer`, app/lm/causal_lm.py), which is the point: the demo
and the tests go through the path a user's own checkpoint takes.

The tokenizer's pipeline is Qwen2's (NFC, its split pattern, byte-level), so the
`Qwen2Tokenizer` that `AutoTokenizer` picks for a qwen2 directory encodes exactly as the
tokenizer built here. That pattern splits digits one by one, so numbers are sequences of digit
tokens and a small model can learn arithmetic digit by digit. The chat template is ChatML; the
end of an assistant turn, `<|im_end|>`, is the eos token a completion stops at.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# Qwen2's pre-tokenizer pattern (transformers' tokenization_qwen2.py): one digit per piece
SPLIT_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                 r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SENTENCES = (
    "The mesh trains a language model with rewards it can check.",
    "Each answer is a number; the reward compares it with the right one.",
    "What is the sum of these two numbers? Answer with the number only.",
)


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def arithmetic_records(max_a: int = 99, max_b: int = 9) -> list[dict]:
    """Every `a+b` with 0 <= a <= max_a, 0 <= b <= max_b, as a chat record with its answer
    (what the math reward reads) and a demonstration (what SFT trains on)."""
    return [{"messages": [{"role": "user", "content": question(a, b)}], "answer": str(a + b),
             "completion": str(a + b)}
            for a in range(max_a + 1) for b in range(max_b + 1)]


def corpus(seed: int = 0, lines: int = 4000) -> Iterator[str]:
    """The tokenizer's training text: chat-rendered questions and answers, and the sentences."""
    rng = random.Random(seed)
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        yield f"{IM_START}user\n{question(a, b)}{IM_END}\n{IM_START}assistant\n{a + b}{IM_END}\n"
    yield from SENTENCES


def build_bpe_tokenizer(texts: Iterable[str], vocab_size: int = 320) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes: every character is bytes first), digits split one by
    one, ChatML special tokens, left padding (the engine pads prompts on the left)."""
    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=IM_END, unk_token=None,
                                  padding_side="left")
    tok.chat_template = CHAT_TEMPLATE
    return tok


@dataclass(frozen=True)
class DemoShape:
    """A small model of a stock architecture: `model_type` is any of transformers' configs
    with these names (qwen2, llama, ...)."""

    model_type: str = "qwen2"
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 128
    max_position: int = 128
    seed: int = 0


def build_demo_model(tok: PreTrainedTokenizerFast, shape: DemoShape = DemoShape()) -> PreTrainedModel:
    config = AutoConfig.for_model(
        shape.model_type, vocab_size=len(tok), hidden_size=shape.hidden_size, num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate,
        max_position_embeddings=shape.max_position, tie_word_embeddings=True, pad_token_id=tok.pad_token_id,
        bos_token_id=None, eos_token_id=tok.eos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(shape.seed)
        model = AutoModelForCausalLM.from_config(config)
    model.generation_config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = tok.eos_token_id
    return model


def write_jsonl(path: Path, records: Iterable[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(path)
    return path


def make_demo(out: Path, shape: DemoShape = DemoShape(), vocab_size: int = 320) -> dict[str, Path]:
    """`out/model/` (a save_pretrained directory: config, weights, tokenizer, chat template) and
    `out/arith.jsonl` (the prompt file of configs/lm_demo.yaml)."""
    tok = build_bpe_tokenizer(corpus(), vocab_size)
    model = build_demo_model(tok, shape)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    hf_logging.disable_progress_bar()
    model.save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))
    return {"model": model_dir, "prompts": write_jsonl(out / "arith.jsonl", arithmetic_records())}
