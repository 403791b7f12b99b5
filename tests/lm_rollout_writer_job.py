"""Subprocess target for tests/test_lm_rollouts.py: LM self-play batches into a rollout store,
with the real model, engine and store, until killed or `--batches` are done.

    python -m tests.lm_rollout_writer_job --db rollouts.db --batches N [--node a]

Each batch has the seed of its number, so a rerun after a kill replays the same batches
(and stores only what the killed run had not).
"""

from __future__ import annotations

import argparse

import torch

from app.config.lm import LMConfig
from app.db.rollout_store import RolloutStore
from app.lm.rollout.batches import batch_prompts, rollout_batch
from app.lm.rollout.engine_config import build_engine
from app.lm.setup import (
    build_task, build_tokenizer, initial_model, rollout_settings, train_prompts,
)

CONFIG = LMConfig.model_validate({
    "model": {"hidden_size": 32, "layers": 1, "heads": 2, "kv_heads": 1, "intermediate": 64, "max_position": 32},
    "task": {"name": "copy", "reward_kind": "partial", "train_prompts": 64},
    "rollout": {"n": 4, "batch_groups": 8, "max_new_tokens": 5, "max_seq_len": 24},
})


def main(argv: list[str] | None = None) -> list[tuple[int, int]]:
    """(stored, already) per batch; also printed one line per batch for a parent process."""
    p = argparse.ArgumentParser()
    p.add_argument("--db", required=True)
    p.add_argument("--batches", type=int, required=True)
    p.add_argument("--node", default="a")
    args = p.parse_args(argv)
    done: list[tuple[int, int]] = []
    torch.set_num_threads(1)
    tok = build_tokenizer(CONFIG.tokenizer)
    engine = build_engine(CONFIG.engines[0], initial_model(CONFIG.model, tok), tok)
    task = build_task(CONFIG.task)
    pool = train_prompts(task, CONFIG.task)
    settings = rollout_settings(CONFIG.rollout)
    with RolloutStore(args.db) as store:
        for b in range(args.batches):
            prompts = batch_prompts(pool, CONFIG.task.seed, b, CONFIG.rollout.batch_groups)
            result = rollout_batch(engine, task, tok, prompts, settings, store, node_id=args.node,
                                   model_id="init", seed=b)
            print(f"batch {b} stored {result.stored} already {result.already}", flush=True)
            done.append((result.stored, result.already))
    return done


if __name__ == "__main__":
    main()
