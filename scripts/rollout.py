#!/usr/bin/env python3
"""Generate scored GRPO groups for a task, ticket-parallel over N processes.

    python scripts/rollout.py --out runs/roll1 [--model-dir DIR | --seed-model 0] [--task copy --digits 3]
        [--batch-size 16 --batches 4 --n 8 --max-new-tokens 8 --temperature 1.0] [--nproc N]

One process by default; with `--nproc N` it re-runs itself under torchrun through
`app.shared.launcher` (logs in <out>/logs). Rank 0 writes <out>/batch_*.jsonl (one row per
ticket: ticket, rank, group) and <out>/manifest.json, and prints the manifest as one JSON
object. A rank that hangs fails the run after `--pg-timeout` seconds (exit 1).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, help="a save_pretrained directory (with tokenizer.json)")
    p.add_argument("--seed-model", type=int, default=0, help="without --model-dir: random init from this seed")
    p.add_argument("--task", choices=("copy", "reverse"), default="copy")
    p.add_argument("--digits", type=int, default=3)
    p.add_argument("--reward", choices=("exact", "partial"), default="exact")
    p.add_argument("--prompts", type=int, default=64, help="size of the prompt set the epochs go over")
    p.add_argument("--batch-size", type=int, default=16, help="tickets (prompts) per global batch")
    p.add_argument("--batches", type=int, default=1)
    # Not "--n": torchrun's parser sees these arguments too and would read it as its own --nnodes.
    p.add_argument("--group-size", type=int, default=8, help="completions per prompt")
    p.add_argument("--max-new-tokens", type=int, default=8)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--weight-version", type=int, default=0)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--pg-timeout", type=float, default=300.0, help="seconds a collective may wait for a rank")
    p.add_argument("--timeout-s", type=float, help="whole-run deadline (multi-process)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def worker(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(1)
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.causal_lm import LMModelConfig, build_model, load_model
    from app.lm.tasks import DigitTask
    from app.lm.tokenizer import build_digit_tokenizer, load_tokenizer
    from app.lm.truncation import RolloutSettings
    from app.log import configure_logging
    from app.lm.train.dist_env import init_distributed, shutdown
    from app.lm.rollout.tickets import RolloutJob, run_rollout

    configure_logging(level="INFO")
    env = init_distributed("auto", timeout_s=args.pg_timeout)
    if args.model_dir:
        tok, model = load_tokenizer(args.model_dir), load_model(args.model_dir)
    else:
        tok = build_digit_tokenizer()
        model = build_model(LMModelConfig(seed=args.seed_model), tok)
    engine = InProcessEngine(model.to(env.device), tok, weight_version=args.weight_version)
    task = DigitTask(args.task, args.digits, args.digits, args.reward)
    prompts = task.make_prompts(args.prompts, args.seed, "train")
    job = RolloutJob(args.batch_size, args.batches, RolloutSettings(
        n=args.group_size, max_new_tokens=args.max_new_tokens, temperature=args.temperature), args.seed, args.weight_version)
    if env.is_main:
        args.out.mkdir(parents=True, exist_ok=True)
    manifest = run_rollout(env, engine, task, tok, prompts, job, args.out)
    if manifest is not None:
        print(json.dumps(manifest), flush=True)
    shutdown()
    return 0


def drop_option(argv: list[str], name: str) -> list[str]:
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == name:
            skip = True
        elif not arg.startswith(name + "="):
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("batch_size", "batches", "group_size", "prompts", "nproc"):
        if getattr(args, name) <= 0:
            print(f"--{name.replace('_', '-')} must be positive", file=sys.stderr)
            return 2
    if args.worker or args.nproc == 1:
        return worker(args)
    from app.shared.launcher import LaunchError, LaunchSpec, launch

    # --nproc stays here: torchrun's parser would take it (as an abbreviation of its own option)
    forwarded = drop_option(list(argv if argv is not None else sys.argv[1:]), "--nproc")
    try:
        launch(LaunchSpec(target=[str(Path(__file__).resolve()), *forwarded, "--worker"], nproc=args.nproc,
                          log_dir=args.out / "logs", timeout_s=args.timeout_s, status_every_s=0, echo=False))
    except LaunchError as exc:
        print(f"rollout failed: {exc}", file=sys.stderr, flush=True)
        return 1
    print((args.out / "manifest.json").read_text(), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
