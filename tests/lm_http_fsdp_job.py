"""torchrun target for tests/test_lm_http_fsdp.py: the online loop on FSDP2 ranks beside ONE
SGLang / vLLM server (a loopback stub), weights synced from disk after every step.

    --url URL --kind sglang|vllm --run-dir DIR --steps N

Rank 0 gathers the whole weights, writes the directory and loads it into the server; every
rank generates its own prompts through the same server once the load is confirmed. Rank 0
writes the run's metrics.jsonl (sft_grpo.run) and `ranks.json` (each rank's engine version).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--kind", choices=("sglang", "vllm"), required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    from app.lm.causal_lm import LMModelConfig, build_model
    from app.lm.rollout.sglang_engine import SGLangEngine
    from app.lm.rollout.vllm_engine import VLLMEngine
    from app.lm.tasks import DigitTask
    from app.lm.tokenizer import build_digit_tokenizer
    from app.lm.train.backend import OptimConfig
    from app.lm.train.dist_env import init_distributed, shutdown
    from app.lm.train.fsdp_backend import FSDPBackend
    from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
    from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
    from app.lm.train.sft_grpo import RunPlan, run
    from app.lm.train.weight_publish import WeightPublisher
    from app.lm.truncation import RolloutSettings

    env = init_distributed("cpu", timeout_s=120)
    tok = build_digit_tokenizer()
    task = DigitTask("copy", 2, 3, "partial")
    rollout = RolloutSettings(n=2, max_new_tokens=4, temperature=1.0)
    backend = FSDPBackend(build_model(LMModelConfig(seed=3), tok), OptimConfig(lr=1e-3), sft_loss, env)
    publish = WeightPublisher(backend.get_weights, model=backend.model, tokenizer=tok,
                              out_dir=args.run_dir / "engine_weights", writer=env.is_main)
    engine = (SGLangEngine if args.kind == "sglang" else VLLMEngine)(args.kind, args.url, sync_timeout_s=30.0)
    source = GeneratedGroups(engine, task, tok, task.make_prompts(16, 4, "train"), seed=9, prompts_per_step=4,
                             rollout=rollout, publish=publish, rank=env.rank, world_size=env.world_size,
                             filters=LoopFilters(1.0, "keep", 1))
    run(backend, tok, args.run_dir, RunPlan(None, 1e-3, args.steps, 1e-3, save=False), demonstrations=[],
        source=source, loss_fn=grpo_loss_fn(GRPOConfig(), rollout.temperature, None))
    versions = env.all_reduce_floats([float(engine.weight_version) if r == env.rank else 0.0
                                      for r in range(env.world_size)])
    if env.is_main:
        (args.run_dir / "ranks.json").write_text(json.dumps({"versions": versions}))
    shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
