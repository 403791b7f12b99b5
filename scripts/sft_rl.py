#!/usr/bin/env python3
"""SFT, GRPO or SFT then GRPO of the small digit Llama on copy/reverse, resumable.

    python scripts/sft_rl.py --run-dir runs/lm1 [--mode sft+rl] [--task copy --digits 3]
        [--sft-steps 60 --rl-steps 150] [--nproc N] [--export DIR]

The online run: the same SFT -> GRPO run a mesh generation trains (app/lm/train/sft_grpo.py),
with rollouts generated as it trains by an in-process engine that gets the new weights after
every step. One process (LocalBackend) by default; `--nproc N` re-runs itself under torchrun
through `app.shared.launcher` with the FSDP2 backend. Re-running the same command resumes each
phase from its newest complete checkpoint. Prints one JSON object: what ran and the greedy
exact match on held-out prompts.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config.lm import LMGRPOSettings  # noqa: E402  (after the path)

PROMPTS = 400  # training prompts (the demonstrations of SFT, the prompts of GRPO)
GRPO_LR = LMGRPOSettings.model_fields["lr"].default  # the measured default (docs/benchmarks/lm_tasks.md)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--mode", choices=("sft", "rl", "sft+rl"), default="sft+rl")
    p.add_argument("--task", choices=("copy", "reverse"), default="copy")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--reward", choices=("exact", "partial"), default="exact")
    p.add_argument("--sft-steps", type=int, default=60)
    p.add_argument("--rl-steps", type=int, default=150)
    p.add_argument("--sft-lr", type=float, default=2e-3)
    p.add_argument("--rl-lr", type=float, default=GRPO_LR, help="default: lm.grpo.lr's (app/config/lm.py)")
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export", type=Path, help="save_pretrained directory of the final weights")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def worker(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    from app.lm.data_buffer import DataBuffer
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.causal_lm import LMModelConfig, build_model
    from app.lm.tasks import DigitTask
    from app.lm.tokenizer import build_digit_tokenizer
    from app.lm.truncation import RolloutSettings
    from app.log import configure_logging
    from app.lm.train.backend import LocalBackend, OptimConfig
    from app.lm.train.dist_env import init_distributed, shutdown
    from app.lm.train.evaluate import evaluate
    from app.lm.train.fsdp_backend import FSDPBackend
    from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
    from app.lm.train.hf_io import save_hf
    from app.lm.train.rollout_sources import GeneratedGroups
    from app.lm.train.sft_grpo import RunPlan, SFTConfig, run, sft_rows

    configure_logging(level="INFO")
    env = init_distributed("auto")
    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(seed=args.seed), tok)
    engine = InProcessEngine(copy.deepcopy(model).to(env.device), tok)
    optim = OptimConfig(lr=args.sft_lr)
    backend = (FSDPBackend(model, optim, sft_loss, env) if env.world_size > 1
               else LocalBackend(model, optim, sft_loss, env.device))
    task = DigitTask(args.task, args.digits, args.digits, args.reward)
    prompts = task.make_prompts(PROMPTS, args.seed, "train")
    rollout = RolloutSettings(n=args.group_size, max_new_tokens=args.digits + 2)
    plan = RunPlan(SFTConfig(steps=args.sft_steps) if args.mode != "rl" else None, args.sft_lr,
                   args.rl_steps if args.mode != "sft" else 0, args.rl_lr, seed=args.seed,
                   checkpoint_every=args.checkpoint_every)
    # the same run as a mesh generation (app/lm/train/generation.py); only the rollouts differ:
    # generated here, by an engine given the trainer's weights after every step
    source = GeneratedGroups(engine, task, tok, DataBuffer(prompts, args.seed + 1), seed=args.seed,
                             prompts_per_step=args.prompts_per_step, rollout=rollout)
    report = run(backend, tok, args.run_dir, plan, demonstrations=sft_rows(task, tok, prompts), source=source,
                 loss_fn=grpo_loss_fn(GRPOConfig(), rollout.temperature))
    report.pop("final", None)
    engine.load_weights(backend.get_weights(), -1)
    if args.export:
        save_hf(backend, args.export.parent, args.export.name, tok)
    if env.is_main:
        result = evaluate(engine, task, tok, task.make_prompts(64, args.seed, "test"), max_new_tokens=args.digits + 2)
        print(json.dumps({**report, "greedy_exact_match": result.exact_match}), flush=True)
    shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.worker or args.nproc == 1:
        return worker(args)
    from app.shared.launcher import LaunchError, LaunchSpec, launch

    raw = list(argv if argv is not None else sys.argv[1:])
    forwarded = [a for i, a in enumerate(raw) if a != "--nproc" and (i == 0 or raw[i - 1] != "--nproc")]
    try:
        launch(LaunchSpec(target=[str(Path(__file__).resolve()), *forwarded, "--worker"], nproc=args.nproc,
                          log_dir=args.run_dir / "logs", status_every_s=0))
    except LaunchError as exc:
        print(f"sft_rl failed: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
