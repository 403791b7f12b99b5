"""The digit tokenizer, built in process with `tokenizers` so nothing is ever downloaded.

One token per character, except the task markers and tool tags, which are single tokens so
that a marker can never be split into characters the model could half-produce. The pre-
tokenizer cuts the text at those markers or at any single character; the decoder fuses the
pieces back without spaces, so `decode(encode(text)) == text` for every text of the alphabet.
Saved as `tokenizer.json` (plus the files `save_pretrained` writes) and read back offline.

`load_tokenizer` reads any saved tokenizer (this one, a model directory's, the BPE of
app/lm/demo_model.py) with `AutoTokenizer`, local files only, with its chat template when it
has one.
"""

from __future__ import annotations

import re
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast
from transformers.utils import logging as hf_logging

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = [PAD, BOS, EOS, UNK]
MARKERS = ["copy:", "rev:", "calc:", "<call>", "</call>", "<result>", "</result>"]
CHARACTERS = list("0123456789") + list("=+-*() ")
VOCAB: list[str] = SPECIAL_TOKENS + MARKERS + CHARACTERS


def _split_pattern() -> str:
    """Markers first (longest wins), else one character."""
    alternatives = sorted(MARKERS, key=len, reverse=True)
    return "|".join(re.escape(m) for m in alternatives) + "|."


def build_digit_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh tokenizer; ids are fixed by `VOCAB` order, so every build gives the same ids.

    Encoding a text with special tokens prepends `<bos>` (a prompt); with
    `add_special_tokens=False` it does not (text appended mid-episode, such as a tool result).
    """
    vocab = {token: i for i, token in enumerate(VOCAB)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(_split_pattern()), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    core.add_special_tokens(SPECIAL_TOKENS)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
    )
    return tok


def save_tokenizer(tok: PreTrainedTokenizerFast, directory: str | Path) -> Path:
    """Write `tokenizer.json` and the HF side files into `directory` (created if missing)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(directory))
    return directory


class TokenizerLoadError(ValueError):
    """A tokenizer directory that cannot be read; one line naming the path and the config key."""


def load_tokenizer(directory: str | Path, key: str = "lm.tokenizer.path") -> PreTrainedTokenizerBase:
    """A saved tokenizer from a local directory (never the hub), padding on the left (the
    engine's batches), with a pad token (the eos when the tokenizer has none, as for Llama)."""
    path = Path(directory)
    if not path.is_dir():
        raise TokenizerLoadError(f"{key}: {directory} is not a local directory (nothing is downloaded)")
    if not any((path / name).is_file() for name in TOKENIZER_FILES):
        raise TokenizerLoadError(f"{key}: {directory} holds none of {', '.join(TOKENIZER_FILES)}")
    hf_logging.disable_progress_bar()
    try:
        tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerLoadError(f"{key}: {directory}: cannot load its tokenizer: {first}") from None
    if tok.eos_token_id is None:
        raise TokenizerLoadError(f"{key}: {directory}: the tokenizer has no eos token (a completion could not stop)")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok
