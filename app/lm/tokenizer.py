"""The digit tokenizer, built in process with `tokenizers` so nothing is ever downloaded.

One token per character, except the task markers and tool tags, which are single tokens so
that a marker can never be split into characters the model could half-produce. The pre-
tokenizer cuts the text at those markers or at any single character; the decoder fuses the
pieces back without spaces, so `decode(encode(text)) == text` for every text of the alphabet.
Saved as `tokenizer.json` (plus the files `save_pretrained` writes) and read back offline.
"""

from __future__ import annotations

import re
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

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


def load_tokenizer(directory: str | Path) -> PreTrainedTokenizerFast:
    """Read a saved tokenizer from a local directory; a missing `tokenizer.json` is an error naming it."""
    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no tokenizer.json in {directory}")
    tok = PreTrainedTokenizerFast.from_pretrained(str(directory), local_files_only=True)
    tok.padding_side = "left"
    return tok
