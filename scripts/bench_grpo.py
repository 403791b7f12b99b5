#!/usr/bin/env python3
"""GRPO throughput of the digit Llama at 1 and 2 ranks: prints ONE JSON object.

    python scripts/bench_grpo.py [--steps 20 --warmup 3 --prompts-per-step 8 --group-size 8] [--ranks 1,2]
                                 [--device auto|cpu|cuda] [--backend auto|local|fsdp]

Each rank count runs under torchrun (app.shared.launcher): 1 rank with LocalBackend, more
with FSDP2, every rank generating its share of each step's prompts with its own in-process
engine. Per rank count: rollout tokens/s (generated tokens of all ranks / rollout wall time),
training tokens/s (response tokens trained / training wall time), and the share of a step in
rollout, training and weight sync (the engine reloading the new weights), over the measured
steps after `--warmup` steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def worker(args: argparse.Namespace) -> int:
    import copy

    import torch

    torch.set_num_threads(1)
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.causal_lm import LMModelConfig, build_model
    from app.lm.tasks import DigitTask
    from app.lm.tokenizer import build_digit_tokenizer
    from app.lm.truncation import RolloutSettings
    from app.log import configure_logging
    from app.lm.train.backend import LocalBackend, OptimConfig
    from app.lm.data_buffer import DataBuffer
    from app.lm.train.dist_env import init_distributed, shutdown
    from app.lm.train.fsdp_backend import FSDPBackend
    from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
    from app.lm.train.rollout_sources import GeneratedGroups
    from app.lm.train.sft_grpo import grpo_loop

    configure_logging(level="WARNING")
    env = init_distributed(args.device)
    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(seed=0), tok)
    engine = InProcessEngine(copy.deepcopy(model).to(env.device), tok)
    optim = OptimConfig(lr=3e-3)
    use_fsdp = args.backend == "fsdp" or (args.backend == "auto" and env.world_size > 1)
    backend = FSDPBackend(model, optim, sft_loss, env) if use_fsdp else LocalBackend(model, optim, sft_loss)
    task = DigitTask("copy", 3, 3, "partial")
    rollout = RolloutSettings(n=args.group_size, max_new_tokens=4, length_is_parse_failure=False)
    source = GeneratedGroups(engine, task, tok, DataBuffer(task.make_prompts(400, 1, "train"), 0), seed=0,
                             prompts_per_step=args.prompts_per_step, rollout=rollout, micro_batch_size=64)
    history = grpo_loop(backend, source, tok.pad_token_id, grpo_loss_fn(GRPOConfig(), rollout.temperature),
                        args.warmup + args.steps)[args.warmup:]
    if env.is_main:
        total = {k: sum(h[k] for h in history) for k in ("rollout_s", "train_s", "sync_s", "generated_tokens",
                                                         "trained_tokens")}
        step_s = total["rollout_s"] + total["train_s"] + total["sync_s"]
        result = {"ranks": env.world_size, "steps": len(history), "device": str(env.device),
                  "backend": type(backend).__name__,
                  "rollout_tokens_per_s": total["generated_tokens"] / total["rollout_s"],
                  "training_tokens_per_s": total["trained_tokens"] / total["train_s"],
                  "step_s": step_s / len(history),
                  "share": {"rollout": total["rollout_s"] / step_s, "training": total["train_s"] / step_s,
                            "sync": total["sync_s"] / step_s},
                  "final_mean_reward": history[-1]["mean_reward"]}
        Path(args.result).write_text(json.dumps(result))
    shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--ranks", default="1,2")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="auto: NCCL on GPUs when each rank has one, else gloo on the CPU")
    p.add_argument("--backend", choices=("auto", "local", "fsdp"), default="auto",
                   help="auto: FSDP2 from 2 ranks on; fsdp forces it at 1 rank too (FSDP2 on one GPU)")
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    import io
    import os

    from app.shared.launcher import LaunchSpec, launch

    out = {"benchmark": "grpo", "model": "digit llama ~75k params", "task": "copy 3 digits, partial credit",
           "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
           "load_avg_1m": os.getloadavg()[0], "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in [int(x) for x in args.ranks.split(",")]:
            result = Path(tmp) / f"r{nproc}.json"
            launch(LaunchSpec(target=[str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--prompts-per-step", str(args.prompts_per_step),
                                      "--group-size", str(args.group_size), "--result", str(result),
                                      "--device", args.device, "--backend", args.backend],
                              nproc=nproc, log_dir=Path(tmp) / f"logs{nproc}", status_every_s=0), out=io.StringIO())
            out["runs"][str(nproc)] = json.loads(result.read_text())
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
