"""Throughput of the LM workload's self-play step and its gate, from a node config.

    python scripts/bench_lm_selfplay.py [--config configs/lm_copy.yaml] [--batches 5]

Runs `--batches` rollout batches with the random-init model through the configured in-process
engine into a fresh rollout store (app/lm/rollout/batches.py), then one paired greedy
evaluation of the model against itself on the held-out set (app/lm/workload/heldout.py), and
prints one JSON object: groups/s and completions/s of self-play, the share of a batch spent
generating vs storing, store inserts/s, and the seconds of one paired evaluation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import load_settings  # noqa: E402
from app.db.rollout_store import RolloutStore  # noqa: E402
from app.lm.workload.heldout import evaluate_pair  # noqa: E402
from app.lm.rollout.batches import batch_prompts, rollout_batch, to_record  # noqa: E402
from app.lm.rollout.engine_config import build_engine  # noqa: E402
from app.lm.setup import (  # noqa: E402
    build_task, build_tokenizer, greedy_settings, heldout_prompts, initial_model, rollout_settings,
    train_prompts,
)
from app.lm.rollout.groups import generate_groups  # noqa: E402
from app.log import configure_logging  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", type=Path, default=Path("configs/lm_copy.yaml"))
    p.add_argument("--batches", type=int, default=5)
    args = p.parse_args()
    configure_logging()  # self-play logs each batch; stdout carries only the one JSON object
    torch.set_num_threads(1)
    lm = load_settings(args.config).lm
    tok = build_tokenizer(lm.tokenizer)
    engine = build_engine(lm.engines[0], initial_model(lm.model, tok), tok)
    task = build_task(lm.task)
    pool, settings = train_prompts(task, lm.task), rollout_settings(lm.rollout)
    size = lm.rollout.batch_groups
    with tempfile.TemporaryDirectory() as tmp, RolloutStore(Path(tmp) / "rollouts.db") as store:
        start = time.perf_counter()
        for b in range(args.batches):
            rollout_batch(engine, task, tok, batch_prompts(pool, 0, b, size), settings, store, node_id="bench",
                          model_id="init", seed=b)
        selfplay_s = time.perf_counter() - start
        t0 = time.perf_counter()
        groups = generate_groups(engine, task, tok, batch_prompts(pool, 0, args.batches, size), settings, seed=99)
        generate_s = time.perf_counter() - t0
        records = [to_record(g, uid=f"{i:032x}", node_id="bench", task=task.name, model_sha256=None, created_at=0.0)
                   for i, g in enumerate(groups)]
        t0 = time.perf_counter()
        store.add_groups(records)
        store_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    evaluate_pair(engine, engine, task, tok, heldout_prompts(task, lm.task), greedy_settings(lm),
                  confidence=lm.eval.confidence, method=lm.eval.method)
    eval_s = time.perf_counter() - t0
    groups_total = args.batches * size
    print(json.dumps({
        "config": str(args.config), "batches": args.batches, "groups_per_batch": size, "n": lm.rollout.n,
        "selfplay_groups_per_s": round(groups_total / selfplay_s, 2),
        "selfplay_completions_per_s": round(groups_total * lm.rollout.n / selfplay_s, 1),
        "batch_share_generate": round(generate_s / (generate_s + store_s), 3),
        "batch_share_store": round(store_s / (generate_s + store_s), 3),
        "store_groups_per_s": round(len(records) / store_s, 1),
        "paired_eval_s": round(eval_s, 3), "heldout_prompts": lm.task.heldout_prompts,
        "threads": torch.get_num_threads(),
    }))


if __name__ == "__main__":
    main()
