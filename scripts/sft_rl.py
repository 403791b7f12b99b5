#!/usr/bin/env python3
"""SFT, GRPO or SFT then GRPO of the small digit Llama on copy/reverse, resumable.

    python scripts/sft_rl.py --run-dir runs/lm1 [--mode sft+rl] [--task copy --digits 3]
        [--sft-steps 60 --rl-steps 150] [--nproc N] [--export DIR]
        [--temperature T] [--kl-coef C [--reference DIR]]
        [--oversample F] [--zero-variance keep|drop] [--max-staleness K]
        [--overlong-group keep|mask_loss|drop_group] [--max-seq-len L]
        [--engine in_process|sglang|vllm --engine-url URL --sync disk|tensor --sync-timeout S]
        [--reward-workers W --reward-timeout S]

The online run: the same SFT -> GRPO run a mesh generation trains (app/lm/train/sft_grpo.py),
through the same loss (grpo_loss_fn: temperature, KL reference), with rollouts generated as it
trains through the rollout manager's over-sampling and filters, by an engine that gets the new
weights after every step: in process (default), or an SGLang / vLLM server loading them from
`RUN/engine_weights/step_N` (sync disk) or as tensors (sync tensor). Rewards run in a pool of
worker processes, each call bounded. One process (LocalBackend) by default; `--nproc N` re-runs
itself under torchrun through `app.shared.launcher` with the FSDP2 backend: each rank its own
in-process engine, or all of them one SGLang / vLLM server that rank 0 loads the gathered
weights into. Re-running the same command resumes each phase from its newest complete checkpoint.
Prints one JSON object: what ran, the dropped groups by reason and the greedy exact match on
held-out prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config.lm import LMConfig  # noqa: E402  (after the path)

PROMPTS = 400  # training prompts (the demonstrations of SFT, the prompts of GRPO)
# One set of defaults for both entry points: every default below is the node config's (lm.*),
# measured in docs/benchmarks/lm_tasks.md, so this script runs what a mesh node runs.
D = LMConfig()
GRPO_LR = D.grpo.lr


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--mode", choices=("sft", "rl", "sft+rl"), default="sft+rl")
    p.add_argument("--task", choices=("copy", "reverse"), default="copy")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--reward", choices=("exact", "partial"), default="exact")
    p.add_argument("--sft-steps", type=int, default=D.grpo.sft.steps)
    p.add_argument("--rl-steps", type=int, default=150)
    p.add_argument("--sft-lr", type=float, default=D.grpo.sft.lr)
    p.add_argument("--rl-lr", type=float, default=GRPO_LR, help="default: lm.grpo.lr's (app/config/lm.py)")
    p.add_argument("--prompts-per-step", type=int, default=D.grpo.groups_per_step)
    p.add_argument("--group-size", type=int, default=D.rollout.n)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=D.rollout.temperature)
    p.add_argument("--kl-coef", type=float, default=D.grpo.kl_coef)
    p.add_argument("--reference", type=Path, help="KL reference model directory (default: the policy GRPO starts from)")
    p.add_argument("--oversample", type=float, default=D.rollout.oversample)
    p.add_argument("--zero-variance", choices=("keep", "drop"), default=D.rollout.zero_variance)
    p.add_argument("--max-staleness", type=int, default=D.rollout.max_staleness)
    p.add_argument("--tis-cap", type=float, default=D.grpo.tis_cap,
                   help="behaviour correction: token weight min(pi_trainer / pi_engine, cap); 0 = off")
    p.add_argument("--overlong-group", choices=("keep", "mask_loss", "drop_group"), default=D.rollout.overlong_group)
    p.add_argument("--max-seq-len", type=int, default=D.rollout.max_seq_len)
    p.add_argument("--engine", choices=("in_process", "sglang", "vllm"), default="in_process")
    p.add_argument("--engine-url", help="http://host:port of the SGLang / vLLM server")
    p.add_argument("--engine-model", default="default", help="vllm: the served model name")
    p.add_argument("--sync", choices=("disk", "tensor"), help="default: tensor in process, disk over HTTP")
    p.add_argument("--sync-timeout", type=float, default=300.0)
    p.add_argument("--nccl-master", help="vllm tensor sync: host:port of the trainer's NCCL group")
    p.add_argument("--reward-workers", type=int, default=D.reward_pool.workers)
    p.add_argument("--reward-timeout", type=float, default=D.reward_pool.timeout_s)
    p.add_argument("--export", type=Path, help="save_pretrained directory of the final weights")
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def worker(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    from app.config.lm import LMEngineSettings
    from app.lm.causal_lm import LMModelConfig, build_model
    from app.lm.reward_pool import RewardPool
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.rollout.engine_config import build_engine
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
    from app.lm.train.reference import reference_model
    from app.lm.train.consumed import ConsumedGroups
    from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
    from app.lm.train.sft_grpo import RunPlan, SFTConfig, run, sft_rows
    from app.lm.train.weight_publish import WeightPublisher

    configure_logging(level="INFO")
    env = init_distributed("auto")
    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(seed=args.seed), tok)
    evaluator = InProcessEngine(build_model(LMModelConfig(seed=args.seed), tok).to(env.device), tok)
    engine_cfg = LMEngineSettings(name=args.engine, kind=args.engine, url=args.engine_url, model=args.engine_model,
                                  sync=args.sync, sync_timeout_s=args.sync_timeout, nccl_master=args.nccl_master)
    engine = build_engine(engine_cfg, build_model(LMModelConfig(seed=args.seed), tok).to(env.device), tok)
    reference = reference_model(model, args.reference, env.device) if args.kl_coef else None
    optim = OptimConfig(lr=args.sft_lr, weight_decay=D.grpo.weight_decay, max_grad_norm=D.grpo.max_grad_norm)
    backend = (FSDPBackend(model, optim, sft_loss, env) if env.world_size > 1
               else LocalBackend(model, optim, sft_loss, env.device))
    task = DigitTask(args.task, args.digits, args.digits, args.reward)
    prompts = task.make_prompts(PROMPTS, args.seed, "train")
    rollout = RolloutSettings(n=args.group_size, max_new_tokens=args.digits + 2, temperature=args.temperature,
                              max_seq_len=args.max_seq_len, overlong_group=args.overlong_group)
    plan = RunPlan(SFTConfig(steps=args.sft_steps) if args.mode != "rl" else None, args.sft_lr,
                   args.rl_steps if args.mode != "sft" else 0, args.rl_lr, seed=args.seed,
                   checkpoint_every=args.checkpoint_every)
    publish = WeightPublisher(backend.get_weights, model=backend.model, tokenizer=tok, writer=env.is_main,
                              out_dir=args.run_dir / "engine_weights" if engine.sync_mode == "disk" else None)
    rewards = RewardPool(task, workers=args.reward_workers, timeout_s=args.reward_timeout,
                         stop_after=D.reward_pool.stop_after_failed_batches)
    # the same run and the same loss as a mesh generation (app/lm/train/generation.py); only the
    # rollouts differ: generated here, by an engine given the trainer's weights after every step
    source = GeneratedGroups(engine, task, tok, prompts, seed=args.seed, prompts_per_step=args.prompts_per_step,
                             rollout=rollout, publish=publish, rewards=rewards, rank=env.rank,
                             world_size=env.world_size,
                             filters=LoopFilters(args.oversample, args.zero_variance, args.max_staleness),
                             consumed=ConsumedGroups(args.run_dir, env.rank))
    try:
        report = run(backend, tok, args.run_dir, plan, demonstrations=sft_rows(task, tok, prompts), source=source,
                     loss_fn=grpo_loss_fn(GRPOConfig(clip_low=D.grpo.clip_low, clip_high=D.grpo.clip_high,
                                                     kl_coef=args.kl_coef, tis_cap=args.tis_cap),
                                          rollout.temperature, reference),
                     reference=reference, reference_is_start=args.reference is None)
    finally:
        rewards.close()
    report.pop("final", None)
    evaluator.load_weights(backend.get_weights(), -1)
    if args.export:
        save_hf(backend, args.export.parent, args.export.name, tok)
    if env.is_main:
        heldout = task.make_prompts(64, args.seed, "test")
        result = evaluate(evaluator, task, tok, heldout, max_new_tokens=args.digits + 2)
        print(json.dumps({**report, "dropped_groups": source.manager.dropped(),
                          "greedy_exact_match": result.exact_match}), flush=True)
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
