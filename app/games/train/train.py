"""The torchrun target: train a policy/value network on an exported dataset.

    python -m app.shared.launcher --nproc 2 --log-dir runs/r1/logs -- \
        --dataset data/datasets/d1 --run-dir runs/r1 [--parent best.safetensors] [--resume auto]

Also runs as a plain process (`python -m app.games.train.train ...`): one rank, gloo on a free
port. DDP uses gloo on CPU and NCCL on GPU. Rank 0 alone writes, each atomically, into
`--run-dir`: `checkpoint.pt` (full unsharded state, resumable on any world size),
`metrics.jsonl` (one JSON object per line: step, eval and done events), the candidate model
(safetensors + sidecar naming its parent and the dataset sha256) and `result.json`.
Exit codes: 0 done, 2 bad input (dataset, parent, checkpoint, options).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from app.atomic_files import atomic_write_json
from app.games.search.model import Architecture, ModelFormatError, ModelMeta, PolicyValueNet, load_model, new_model, save_model
from app.config import ConfigError, load_settings
from app.games import get_game
from app.games.train.checkpoint import CheckpointError, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from app.games.train.dataset import DatasetError, load_dataset
from app.games.train.run_files import CANDIDATE_NAME, CHECKPOINT_NAME, METRICS_NAME, RESULT_NAME
from app.shared.process_group import DistContext, run_rank
from app.games.train.train_schedule import ScheduleError, resolve_micro_batches
from app.games.train.train_task import PolicyValueTask
from app.games.train.trainer import Trainer, set_global_seed



class TrainInputError(RuntimeError):
    """Bad input to a training run (options, dataset, parent, checkpoint): exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="app.games.train.train", description="Train a policy/value net (torchrun target).")
    p.add_argument("--dataset", required=True, type=Path, help="dataset directory (manifest.json, train/holdout.npz)")
    p.add_argument("--run-dir", required=True, type=Path, help="where rank 0 writes checkpoint, metrics, result")
    p.add_argument("--config", type=Path, help="node config YAML (model and train sections)")
    p.add_argument("--parent", type=Path, help="warm-start from this model; named as the candidate's parent")
    p.add_argument("--resume", help="checkpoint path, or 'auto' for <run-dir>/checkpoint.pt when present")
    p.add_argument("--candidate", type=Path, help=f"candidate path (default <run-dir>/{CANDIDATE_NAME})")
    p.add_argument("--generation", type=int, help="candidate generation (default parent's + 1)")
    for name, kind in (("batch-size", int), ("lr", float), ("weight-decay", float), ("epochs", int),
                       ("micro-batches", int), ("eval-every", int), ("patience", int),
                       ("checkpoint-every", int), ("seed", int), ("channels", int), ("blocks", int)):
        p.add_argument(f"--{name}", type=kind, help="default: from config")
    p.add_argument("--max-steps", type=int, default=None, help="stop after this many optimizer steps in total (0: epochs decide; default: from config)")
    p.add_argument("--min-delta", type=float, default=0.0, help="holdout improvement that counts for early stopping")
    p.add_argument("--log-every", type=int, default=10, help="steps between metric lines")
    p.add_argument("--keep-checkpoints", action="store_true", help="also keep checkpoint_step<N>.pt for every checkpoint")
    p.add_argument("--calibration-samples", type=int, default=2048, help="samples for BatchNorm recalibration")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    return p


def resolve_options(args: argparse.Namespace) -> dict[str, Any]:
    """Command line over config over defaults, as one flat dict."""
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise TrainInputError(str(exc)) from None
    tc, mc = settings.train, settings.model
    pick = lambda value, default: default if value is None else value  # noqa: E731
    opts = {
        "batch_size": pick(args.batch_size, tc.batch_size), "lr": pick(args.lr, tc.lr),
        "weight_decay": pick(args.weight_decay, tc.weight_decay), "epochs": pick(args.epochs, tc.epochs),
        "micro_batches": pick(args.micro_batches, tc.micro_batches), "eval_every": pick(args.eval_every, tc.eval_every),
        "patience": pick(args.patience, tc.patience), "checkpoint_every": pick(args.checkpoint_every, tc.checkpoint_every),
        "seed": pick(args.seed, tc.seed), "channels": pick(args.channels, mc.channels), "blocks": pick(args.blocks, mc.blocks),
        "max_steps": pick(args.max_steps, tc.max_steps), "min_delta": args.min_delta, "log_every": max(1, args.log_every),
    }
    for key in ("batch_size", "epochs", "channels"):
        if opts[key] <= 0:
            raise TrainInputError(f"--{key.replace('_', '-')} must be positive, got {opts[key]}")
    if opts["max_steps"] < 0:
        raise TrainInputError(f"--max-steps must be >= 0, got {opts['max_steps']}")
    return opts


class RunWriter:
    """Rank 0's outputs. On other ranks every method does nothing, so callers need no `if`."""

    def __init__(self, ctx: DistContext, run_dir: Path) -> None:
        self.active = ctx.is_main
        self.run_dir = run_dir
        if self.active:
            run_dir.mkdir(parents=True, exist_ok=True)

    def metric(self, event: str, **fields: Any) -> None:
        if self.active:
            with open(self.run_dir / METRICS_NAME, "a") as fh:
                fh.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")

    def progress(self, text: str) -> None:
        if self.active:
            print(text, flush=True)

    def json(self, name: str, data: dict) -> None:
        if self.active:
            atomic_write_json(self.run_dir / name, data, indent=2)


def load_resume_state(ctx: DistContext, resume: str | None, run_dir: Path) -> dict[str, Any] | None:
    """Rank 0 reads the checkpoint and sends it to every rank (they may be on other machines)."""
    if not resume:
        return None
    path = run_dir / CHECKPOINT_NAME if resume == "auto" else Path(resume)
    loaded: Any = None
    if ctx.is_main:
        if resume == "auto" and not path.exists():
            loaded = None
        else:
            try:
                loaded = load_checkpoint(path)
            except CheckpointError as exc:
                loaded = {"__error__": str(exc)}
    loaded = ctx.broadcast(loaded)
    if isinstance(loaded, dict) and "__error__" in loaded:
        raise TrainInputError(loaded["__error__"])
    return loaded


def build_model(opts: dict, game_name: str, parent: Path | None, resume: dict | None) -> tuple[PolicyValueNet, Architecture, ModelMeta | None]:
    game = get_game(game_name)
    if resume is not None:
        arch = Architecture.from_dict(resume["architecture"])
        parent_meta = ModelMeta(arch, game_name, resume.get("parent_generation", 0), sha256=resume.get("parent_sha256"))
        return PolicyValueNet(arch), arch, parent_meta if resume.get("parent_sha256") else None
    if parent is not None:
        try:
            net, meta = load_model(parent, expect_game=game_name)
        except ModelFormatError as exc:
            raise TrainInputError(str(exc)) from None
        return net, meta.architecture, meta
    arch = Architecture.for_game(game, opts["channels"], opts["blocks"])
    return new_model(arch, seed=opts["seed"]), arch, None


def run(args: argparse.Namespace, ctx: DistContext) -> dict[str, Any]:
    opts = resolve_options(args)
    out = RunWriter(ctx, args.run_dir)
    try:
        dataset = load_dataset(args.dataset)
    except DatasetError as exc:
        raise TrainInputError(str(exc)) from None
    resume = load_resume_state(ctx, args.resume, args.run_dir)
    if resume is not None:
        if resume.get("dataset_sha256") != dataset.sha256:
            raise TrainInputError(f"checkpoint was made on dataset {str(resume.get('dataset_sha256'))[:12]}, "
                                  f"not on {args.dataset} ({dataset.sha256[:12]})")
        for key in ("batch_size", "seed", "lr", "weight_decay"):
            opts[key] = resume[key]  # the trajectory continues as it began
    try:
        micro, kept = resolve_micro_batches(opts["micro_batches"], ctx.world_size, resume.get("micro_batches") if resume else None)
    except ScheduleError as exc:
        raise TrainInputError(str(exc)) from None
    if not kept:
        out.progress(f"world size {ctx.world_size} does not divide the checkpoint's {resume['micro_batches']} "
                     f"micro-batches: continuing with {micro}; BatchNorm slices change, the trajectory is not bit-identical")
    set_global_seed(opts["seed"])
    model, arch, parent_meta = build_model(opts, dataset.game, args.parent, resume)
    try:
        trainer = Trainer(ctx, model, PolicyValueTask(), dataset.train, dataset.holdout,
                          batch_size=opts["batch_size"], micro_batches=micro, lr=opts["lr"],
                          weight_decay=opts["weight_decay"], seed=opts["seed"],
                          calibration_samples=args.calibration_samples)
    except ScheduleError as exc:
        raise TrainInputError(f"{args.dataset}: {exc}") from None
    if resume is not None:
        trainer.load_state_dict(resume)
        set_rng_state(resume["rng"])
    spe = trainer.steps_per_epoch
    total = opts["epochs"] * spe
    if opts["max_steps"]:
        total = min(total, opts["max_steps"])
    eval_every = opts["eval_every"] or spe
    ckpt_every = opts["checkpoint_every"] or eval_every
    parent_sha = parent_meta.sha256 if parent_meta else None

    def checkpoint() -> None:
        if not ctx.is_main:
            return
        state = {**trainer.state_dict(), "rng": rng_state(), "dataset_sha256": dataset.sha256,
                 "game": dataset.game, "architecture": asdict(arch), "parent_sha256": parent_sha,
                 "parent_generation": parent_meta.generation if parent_meta else 0,
                 "lr": opts["lr"], "weight_decay": opts["weight_decay"]}
        state["architecture"]["plane_shape"] = list(arch.plane_shape)
        save_checkpoint(state, args.run_dir / CHECKPOINT_NAME)
        if args.keep_checkpoints:
            save_checkpoint(state, args.run_dir / f"checkpoint_step{trainer.step:06d}.pt")

    out.metric("start", step=trainer.step, total_steps=total, world_size=ctx.world_size, micro_batches=micro,
               batch_size=trainer.batch_size, lr=opts["lr"], steps_per_epoch=spe, resumed=resume is not None,
               dataset_sha256=dataset.sha256, train_samples=len(dataset.train), holdout_samples=len(dataset.holdout))
    out.progress(f"training {total - trainer.step} steps from step {trainer.step}: world {ctx.world_size}, "
                 f"batch {trainer.batch_size} in {micro} slices, {len(dataset.train)} samples, device {ctx.device}")
    started = time.time()
    logged_at, logged_seconds = trainer.step, trainer.step_seconds
    while trainer.step < total and not trainer.stopped_early:
        sums = trainer.train_step()
        step = trainer.step
        if step % opts["log_every"] == 0 or step == total:
            metrics = trainer.global_metrics(sums)
            seconds = trainer.step_seconds - logged_seconds
            rate = (step - logged_at) * trainer.batch_size / seconds if seconds > 0 else 0.0
            logged_at, logged_seconds = step, trainer.step_seconds
            epoch, _ = divmod(step - 1, spe)
            out.metric("step", step=step, epoch=epoch, samples_per_s=rate, world_size=ctx.world_size, **metrics)
            out.progress(f"step {step}/{total} epoch {epoch + 1} loss {metrics['loss']:.4f} "
                         f"(policy {metrics['policy_loss']:.4f} value {metrics['value_loss']:.4f}) {rate:.0f} samples/s")
        evaluated = step % eval_every == 0 or step == total
        if evaluated:
            loss, improved = trainer.evaluate(opts["patience"], opts["min_delta"])
            out.metric("eval", step=step, holdout_loss=loss, improved=improved, best_holdout_loss=trainer.early.best_loss,
                       stopped_early=trainer.stopped_early)
        if step % ckpt_every == 0 or step == total or trainer.stopped_early:
            checkpoint()
    candidate = args.candidate or args.run_dir / CANDIDATE_NAME
    result: dict[str, Any] = {
        "status": "stopped_early" if trainer.stopped_early else "completed", "steps": trainer.step,
        "world_size": ctx.world_size, "micro_batches": micro, "dataset_sha256": dataset.sha256,
        "parent_sha256": parent_sha, "wall_s": time.time() - started,
        "best_holdout_loss": None if trainer.early.best_step < 0 else trainer.early.best_loss,
        "best_step": trainer.early.best_step,
    }
    if ctx.is_main:
        net = PolicyValueNet(arch)
        net.load_state_dict(trainer.final_state())
        generation = args.generation if args.generation is not None else (parent_meta.generation + 1 if parent_meta else 1)
        meta = save_model(net, ModelMeta(arch, dataset.game, generation, parent_sha, dataset.sha256), candidate)
        result.update(candidate=str(candidate), candidate_sha256=meta.sha256, generation=generation)
        out.json(RESULT_NAME, result)
        out.metric("done", **result)
        out.progress(f"done: {result['status']} after {trainer.step} steps; candidate {candidate} ({meta.sha256[:12]})")
    return result


@record
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_rank(lambda ctx: run(args, ctx), args.device, (TrainInputError,), "training")

if __name__ == "__main__":
    sys.exit(main())
