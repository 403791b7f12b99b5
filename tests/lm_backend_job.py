"""torchrun target for tests/test_lm_backend.py: GRPO steps on fixed batches with the FSDP2 backend.

    --steps N --out losses.json [--save-at K --ckpt-root DIR] [--resume DIR] [--hf-dir DIR --logits PATH]

The global batch of step s is a pure function of s (`global_rows`), cut into equal shares per
rank and micro-batches of 2, so any world size trains on the same data. Rank 0 writes
`{step: [loss, grad_norm]}` as JSON. The test runs the same steps with LocalBackend in process.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import torch

from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import OptimConfig, TrainingBackend, wait
from app.lm.train.batching import (
    TrainSequence,
    chunk,
    collate,
)
from app.shared.process_group import rank_share, take_share
from app.lm.train.checkpoint_dirs import (
    load_training_checkpoint,
    save_training_checkpoint,
)
from app.lm.train.grpo import GRPOConfig, grpo_loss

ROWS, MICRO = 12, 2
OPTIM = OptimConfig(lr=3e-3, max_grad_norm=0.5)
GRPO = GRPOConfig(clip_low=0.2, clip_high=0.28)


def loss_fn(logits, batch):
    return grpo_loss(logits, batch, GRPO)


def global_rows(step: int) -> list[TrainSequence]:
    rng = random.Random(1000 + step)
    rows = []
    for _ in range(ROWS):
        n, p = rng.randint(6, 14), rng.randint(2, 5)
        tokens = [rng.randint(4, 27) for _ in range(n)]
        old = [rng.uniform(-4.0, -1.0) if j >= p else 0.0 for j in range(n)]
        rows.append(TrainSequence(tokens, [0] * p + [1] * (n - p), old, rng.uniform(-1.0, 1.0)))
    return rows


def run_step(backend: TrainingBackend, step: int, pad_id: int) -> tuple[float, float]:
    rows = global_rows(step)
    normalizer = sum(r.trained_tokens for r in rows)
    _, most = rank_share(len(rows), 0, backend.world_size)  # rank 0 has the largest share
    mine = take_share(rows, backend.rank, backend.world_size)
    for micro in chunk(mine, MICRO, count=-(-most // MICRO)):
        wait(backend.forward_backward(collate(micro, pad_id, normalizer)))
    stats = wait(backend.optim_step())
    return stats["loss"], stats["grad_norm"]


def probe_batch(pad_id: int):
    rows = global_rows(999)
    return collate(rows, pad_id, sum(r.trained_tokens for r in rows))


def stock_gpt2(tok):
    """GPT-2's architecture with its shipped dropout (0.1), tiny, left in train mode."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(7)
    cfg = GPT2Config(vocab_size=len(tok), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    return GPT2LMHeadModel(cfg).train()


def dropout_probe(env, tok) -> dict:
    """The FSDP2 backend's forward on a dropout-0.1 GPT-2, twice on one batch, and the eval-mode
    forward of the same weights: all three equal only if the backend trains with dropout off."""
    from app.lm.train.fsdp_backend import FSDPBackend

    model = stock_gpt2(tok)
    backend = FSDPBackend(model, OPTIM, loss_fn, env)
    batch = probe_batch(tok.pad_token_id)
    mine = collate(take_share(global_rows(999), env.rank, env.world_size), tok.pad_token_id, batch.normalizer)
    first = wait(backend.forward_backward(mine))["loss"]
    second = wait(backend.forward_backward(mine))["loss"]
    with torch.no_grad():
        third = float(loss_fn(backend.model(input_ids=mine.input_ids, attention_mask=mine.attention_mask).logits,
                              mine)[0])
    return {"losses": [first, second, third], "training": backend.model.training}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--save-at", type=int, default=0)
    p.add_argument("--ckpt-root", type=Path)
    p.add_argument("--resume", type=Path)
    p.add_argument("--hf-dir", type=Path)
    p.add_argument("--logits", type=Path)
    p.add_argument("--dropout-probe", type=Path)
    args = p.parse_args(argv)
    from app.lm.train.dist_env import init_distributed, shutdown
    from app.lm.train.fsdp_backend import FSDPBackend
    from app.lm.train.hf_io import save_full_state, save_hf

    env = init_distributed("cpu", timeout_s=120)
    tok = build_digit_tokenizer()
    backend = FSDPBackend(build_model(LMModelConfig(seed=5), tok), OPTIM, loss_fn, env)
    start = 1
    if args.resume:
        start = load_training_checkpoint(backend, args.resume)["step"] + 1
    losses = {}
    for step in range(start, args.steps + 1):
        losses[step] = run_step(backend, step, tok.pad_token_id)
        if step == args.save_at:
            save_training_checkpoint(backend, args.ckpt_root, step, {"phase": "test"})
    if args.hf_dir:
        save_full_state(backend, args.hf_dir.parent / "full_state.pt", {"step": args.steps})
        save_hf(backend, args.hf_dir.parent, args.hf_dir.name, tok, max_shard_size="100KB")
        backend.model.eval()
        with torch.no_grad():
            batch = probe_batch(tok.pad_token_id)
            logits = backend.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        if env.is_main:
            torch.save(logits, args.logits)
    if args.dropout_probe:
        probe = dropout_probe(env, tok)
        if env.is_main:
            args.dropout_probe.write_text(json.dumps(probe))
    if env.is_main:
        args.out.write_text(json.dumps(losses))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
