#!/usr/bin/env python3
"""Build the language-model demo offline: a byte-level BPE tokenizer, a small Qwen2 with random
weights and an arithmetic prompt file, the inputs of configs/lm_demo.yaml.

    python scripts/make_lm_demo_model.py [--out data/lm_demo]

Writes `OUT/model/` (config.json, model.safetensors, tokenizer.json, the chat template: a
directory loaded exactly as a downloaded checkpoint is) and `OUT/arith.jsonl` (one chat record
per `a+b`, with its `answer` for the math reward and a `completion` for SFT). Nothing is
downloaded; the same command always writes the same files (app/lm/demo_model.py). Prints one
JSON object: the paths and the model's size.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("data/lm_demo"), help="directory to write model/ and arith.jsonl into")
    args = p.parse_args(argv)
    from app.lm.causal_lm import count_parameters, load_model
    from app.lm.demo_model import make_demo
    from app.lm.tokenizer import load_tokenizer

    paths = make_demo(args.out)
    model, tok = load_model(paths["model"]), load_tokenizer(paths["model"])  # as the config will
    print(json.dumps({"model": str(paths["model"]), "prompts": str(paths["prompts"]),
                      "architecture": type(model).__name__, "parameters": count_parameters(model),
                      "vocab": len(tok), "records": sum(1 for _ in paths["prompts"].open())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
