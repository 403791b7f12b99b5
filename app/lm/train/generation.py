"""The torchrun target of the LM workload: one generation's training (the game workload's is
app/games/train/train.py).

    python -m app.shared.launcher --nproc N --log-dir RUN/logs --module app.lm.train.generation -- \
        --dataset D --run-dir RUN --resume auto --generation G --config CFG [--parent P]

Every rank runs it; rank 0 alone writes. Generation 1 of `lm.grpo.mode: sft+rl` (no parent)
takes `lm.grpo.sft.steps` supervised steps on the task's demonstrations and nothing else, so
the gate scores the SFT model alone (`phase_steps`); every later generation (and every one of
`mode: rl`) takes `lm.grpo.steps` GRPO steps: the one run of app/lm/train/sft_grpo.py. With
`lm.grpo.rollouts: stored` they train on the groups of the exported rollout dataset
(off-policy: against the log-probs stored with them, rollout_sources.StoredGroups). With
`online` (the default) the GRPO steps train instead on groups each rank's in-process engine
generates from the trainer's own weights, synced after every step (rollout_sources.
GeneratedGroups, as scripts/sft_rl.py runs), with the behaviour correction (`lm.grpo.tis_cap`)
and the run's consumed record (consumed.py: a resumed run never trains a group twice); the
dataset then only starts the generation (its task is still checked). Checkpoints go to `RUN/sft` and `RUN/rl`, one
line per step to `RUN/metrics.jsonl`; the same
command after a kill continues from the newest complete checkpoint. At the end: the candidate
`RUN/candidate/` (a Hugging Face directory with its manifest, renamed into place whole) and
`RUN/result.json`. A run whose candidate already verifies exits 0 at once.
Exit codes: 0 done, 2 bad input (config, dataset, parent, run dir).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from torch.distributed.elastic.multiprocessing.errors import record

from app.atomic_files import atomic_write_json
from app.config import ConfigError, load_settings
from app.config.lm import LMConfig
from app.lm.train.checkpoint_dirs import CheckpointDirError
from app.lm.train.consumed import ConsumedGroups, ConsumedRecordError
from app.lm.train.continuation import RESULT_NAME, continued_checkpoint
from app.lm.data_buffer import DataBuffer
from app.lm.train.dist_env import GROUP_TIMEOUT_S
from app.lm.train.evaluate import evaluate
from app.lm.train.grpo import GRPOConfig, grpo_loss_fn
from app.lm.train.mesh_rollouts import mesh_rollouts
from app.lm.train.policy_publish import POLICY_FILE, PolicyPublisher
from app.lm.train.remote_groups import RemoteGroups
from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters, StoredGroups, dataset_problem, drawn_mean_reward
from app.lm.train.sft_grpo import RunPlan, SFTConfig, optimizer_steps, sft_rows
from app.lm.train.sft_grpo import run as run_phases
from app.lm.train.candidate import (
    claim_run_dir,
    finished,
    last_logged,
    parent_sha256,
    publish_candidate,
    stage_candidate,
)
from app.lm.rollout.rollout_dataset import (
    RolloutDatasetError,
    load_rollout_dataset,
    read_rollout_manifest,
)
from app.lm.model_dir import ModelDirError
from app.lm.setup import (
    LMInputError,
    build_task,
    build_tokenizer,
    heldout_prompts,
    rollout_settings,
    train_prompts,
)
from app.shared.process_group import DistContext, rank_share, run_rank
from app.shared.trainer_follow import wait_for_request
from app.lm.train.trainer_build import HeldTrainer, LMTrainInputError, build_trainer

CANDIDATE_NAME = "candidate"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="app.lm.train.generation", description="One LM generation: SFT and/or GRPO.")
    p.add_argument("--dataset", required=True, type=Path, help="exported rollout dataset (app/lm/rollout/rollout_dataset.py)")
    p.add_argument("--run-dir", required=True, type=Path)
    p.add_argument("--config", required=True, type=Path, help="node config with workload: lm")
    p.add_argument("--generation", required=True, type=int)
    p.add_argument("--parent", type=Path, help="Hugging Face directory (with manifest) to start from")
    p.add_argument("--resume", default="auto", help="only 'auto': continue from the newest complete checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (and at each phase's end)")
    p.add_argument("--keep-checkpoints", action="store_true",
                   help="keep every checkpoint (default: the newest of each phase, all a resume reads)")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument("--continue-from", type=Path,
                   help="the run dir that made --parent: its last GRPO checkpoint's optimizer state is continued")
    p.add_argument("--follow", type=Path,
                   help="after the generation, wait `lm.grpo.trainer_wait_s` for the node to write the next one "
                        "here (app/shared/trainer_follow.py) and train it on when its parent is this candidate")
    p.add_argument("--mesh-data-dir", type=Path,
                   help="the data dir of the node that launched this run, given by a node with peers: publish each "
                        "step's policy there for rollout workers and take their groups from its rollout store")
    return p


def load_inputs(args: argparse.Namespace, task_name: str | None = None) -> tuple[LMConfig, list, str, str | None]:
    """(lm settings, groups, dataset sha256, parent sha256): every check that needs no model.
    `task_name`: the task a trainer that stays built already (the same config), not built again."""
    if args.resume != "auto":
        raise LMTrainInputError(f"--resume {args.resume!r}: only 'auto' is supported (resume from the run dir)")
    try:
        settings = load_settings(args.config)
    except ConfigError as exc:
        raise LMTrainInputError(str(exc)) from None
    if settings.workload != "lm":
        raise LMTrainInputError(f"{args.config}: workload is {settings.workload!r}; this trainer needs workload: lm")
    lm = settings.lm
    try:
        manifest, dataset_sha = read_rollout_manifest(args.dataset)
        groups = load_rollout_dataset(args.dataset, dataset_sha)
    except RolloutDatasetError as exc:
        raise LMTrainInputError(str(exc)) from None
    try:
        task_name = task_name or build_task(lm.task, build_tokenizer(lm.tokenizer)).name
    except LMInputError as exc:
        raise LMTrainInputError(f"{args.config}: {exc}") from None
    if manifest.get("task") != task_name:
        raise LMTrainInputError(f"{args.dataset}: rollouts of task {manifest.get('task')!r}, config trains {task_name!r}")
    try:
        parent_sha = parent_sha256(args.parent) if args.parent is not None else None
    except ModelDirError as exc:
        raise LMTrainInputError(f"--parent: {exc}") from None
    return lm, groups, dataset_sha, parent_sha


def say(env: DistContext, text: str) -> None:
    if env.is_main:
        print(text, flush=True)


def run(args: argparse.Namespace, env: DistContext) -> dict[str, Any] | None:
    """One generation; with `--follow`, then each next generation the node hands this trainer
    whose parent is its own last candidate, with the weights and optimizer it holds."""
    held: HeldTrainer | None = None
    try:
        result, held = train_generation(args, env, None)
        wait_s = load_settings(args.config).lm.grpo.trainer_wait_s if held is not None else 0.0
        while held is not None:  # it stays: --follow, and the generation may be trained on
            request = wait_for_request(env, args.follow, args.generation, wait_s)
            if request is None:
                say(env, f"no next generation within {wait_s:.0f} s: this trainer ends")
                break
            if request.parent_sha256 != held.candidate_sha256:
                say(env, f"generation {request.generation} trains from {request.parent_sha256[:12]}, not from this "
                         f"trainer's candidate {str(held.candidate_sha256)[:12]}: this trainer ends "
                         "(the node launches one from that parent)")
                break
            say(env, f"generation {request.generation} continues in this trainer: the weights and optimizer "
                     f"of generation {args.generation}")
            args = argparse.Namespace(**{**vars(args), "dataset": Path(request.dataset), "continue_from": None,
                                         "run_dir": Path(request.run_dir), "generation": request.generation,
                                         "parent": Path(request.parent)})
            result, held = train_generation(args, env, held)
    finally:
        if held is not None and held.rewards is not None:
            held.rewards.close()
    return result


def train_generation(args: argparse.Namespace, env: DistContext,
                     kept: HeldTrainer | None) -> tuple[dict[str, Any] | None, HeldTrainer | None]:
    """(the run's result, what the trainer holds if it may train the next generation on)."""
    run_dir: Path = args.run_dir
    candidate = run_dir / CANDIDATE_NAME
    if env.broadcast(finished(candidate, run_dir / RESULT_NAME) if env.is_main else None):
        say(env, f"{candidate} is complete and verified: nothing to do")
        return None, kept
    lm, groups, dataset_sha, parent_sha = load_inputs(args, kept.task.name if kept is not None else None)
    identity = {"dataset_sha256": dataset_sha, "parent_sha256": parent_sha, "generation": args.generation}
    problem = env.broadcast(claim_run_dir(run_dir, identity) if env.is_main else None)
    if problem:
        raise LMTrainInputError(problem)
    g = lm.grpo
    sft_steps, rl_steps = phase_steps(lm, args.parent is not None)
    held = kept if kept is not None else build_trainer(lm, args.parent, env, sft_steps, rl_steps)
    tok, task, rewards, backend, reference, sampler = (held.tok, held.task, held.rewards, held.backend,
                                                       held.reference, held.sampler)
    online = sampler is not None
    bad = dataset_problem(groups, held.vocab_size) if g.rollouts == "stored" else None
    if bad:
        raise LMTrainInputError(f"{args.dataset}: {bad}")
    # Ranks on several nodes: each commits checkpoints only where rank 0 runs (no shared file
    # system is assumed), so a spanned run neither resumes nor reloads between phases; it keeps
    # its weights in memory and, if killed, trains the generation again from the start. It saves
    # no checkpoints either: a part-written one would mislead a later run alone in this dir.
    spans = int(os.environ.get("LOCAL_WORLD_SIZE", env.world_size)) < env.world_size
    # the optimizer's state of the run that made the parent (continuation.py); not across nodes
    # (no shared disk) nor with LoRA (its adapters are new on the merged parent); a trainer that
    # stayed holds it already
    continue_from, why_not = continued_checkpoint(args.continue_from, parent_sha) \
        if kept is None and args.continue_from is not None and rl_steps and not spans and lm.lora is None \
        else (None, "")
    if why_not:
        say(env, f"not continuing {args.continue_from}: {why_not}; GRPO starts fresh from the parent")
    started = time.time()

    def progress(phase: str, step: int, stats: dict[str, Any]) -> None:
        keys = ("loss", "grad_norm", "mean_reward", "mean_ratio", "clip_fraction")
        say(env, f"{phase} step {step}: " + " ".join(f"{k} {stats[k]:.4g}" for k in keys if k in stats))
        if phase == "rl" and isinstance(source, GeneratedGroups) and g.eval_every and step % g.eval_every == 0:
            heldout_line(env, run_dir, lm, task, tok, source, step)

    micro = max(1, -(-rank_share(g.sft.batch_size, 0, env.world_size)[1] // g.micro_batches))
    plan = RunPlan(SFTConfig(steps=sft_steps, batch_size=g.sft.batch_size, micro_batch_size=micro) if sft_steps else None,
                   g.sft.lr, rl_steps, g.lr, seed=g.seed, checkpoint_every=args.checkpoint_every, save=not spans,
                   rl_warmup=0 if continue_from is not None or kept is not None else g.warmup_steps,  # warmed up already
                   keep_checkpoints=0 if args.keep_checkpoints else 1)
    policy, remote = None, None  # an online run on the mesh: its publisher (rank 0) and reader of workers' groups
    if online:
        rl_micro = max(1, -(-rank_share(g.groups_per_step, 0, env.world_size)[1] * lm.rollout.n // g.micro_batches))
        consumed = ConsumedGroups(run_dir, env.rank) if plan.save else None  # a spanned run restarts whole
        if consumed is not None and kept is not None:
            consumed.carry(kept.carried_uids)  # what the last run read of the policies inherited below
        policy, remote = mesh_rollouts(args.config, run_dir, args.generation, sampler, sampler.config.vocab_size,
                                       rank=env.rank, world_size=env.world_size,
                                       node_data_dir=None if spans else args.mesh_data_dir,
                                       inherited=kept.policies if kept is not None else (),
                                       exclude=consumed.uids if consumed is not None else ())
        source: StoredGroups | GeneratedGroups = online_source(lm, task, tok, sampler, rewards, env, rl_micro,
                                                               consumed, generation=args.generation,
                                                               policy=policy, remote=remote)
        what_rl = f"groups generated online by the trainer's weights (in-process engine, max_staleness " \
                  f"{lm.rollout.max_staleness} steps)"
    else:
        source = StoredGroups(DataBuffer(groups, g.seed + 1), g.groups_per_step, micro_batches=g.micro_batches,
                              scale_by_std=g.scale_by_std, eps=g.eps, zero_variance=lm.rollout.zero_variance)
        what_rl = f"{len(groups)} groups of {args.dataset}"
    demonstrations = sft_rows(task, tok, train_prompts(task, lm.task)) if sft_steps else []
    what = {"sft": f"{len(demonstrations)} demonstrations", "rl": what_rl}
    label = {"sft": "SFT", "rl": "GRPO"}
    announce = lambda phase, first, last: say(  # noqa: E731
        env, f"{label[phase]} steps {first}..{last} on {what[phase]}, world {env.world_size}")
    dropped = log_dropped_groups(env, run_dir, args.dataset)
    held_steps = optimizer_steps(backend) if kept is not None else None
    try:
        report = run_phases(backend, tok, run_dir, plan, demonstrations=demonstrations, source=source,
                            reference=reference, reference_is_start=g.reference is None, on_step=progress,
                            on_phase=announce, continue_from=continue_from,
                            loss_fn=grpo_loss_fn(GRPOConfig(g.clip_low, g.clip_high, g.kl_coef,
                                                            g.tis_cap if online else 0.0),
                                                 lm.rollout.temperature, reference))
    except BaseException:
        if kept is None and rewards is not None:
            rewards.close()  # a kept trainer's pool is closed by run()
        raise
    finally:
        if isinstance(source, GeneratedGroups) and source.remote is not None:
            source.remote.close()
    if kept is not None:
        report["continued_from"] = {"in_memory": str(kept.run_dir), "optimizer_steps": held_steps}
    # the trainer stays for the next generation (--follow) only as a GRPO trainer would have been
    # continued (continuation.py): after GRPO steps (an SFT generation's optimizer is not GRPO's),
    # on this node alone, without LoRA; the node reads it in result.json
    stays = bool(rl_steps) and not spans and lm.lora is None and args.follow is not None and g.trainer_wait_s > 0
    final = report.get("final") or last_logged(run_dir, "rl" if rl_steps else "sft")
    staged = stage_candidate(backend, tok, run_dir, CANDIDATE_NAME)
    result = None if staged is None else publish_result(env, args, run_dir, staged, {
        "parent_sha256": parent_sha, "dataset_sha256": dataset_sha, "sft_steps": sft_steps, "rl_steps": rl_steps,
        "final": final, "world_size": env.world_size, "groups": len(groups), "rollouts": g.rollouts,
        "mean_reward": (None if not rl_steps else final.get("mean_reward") if online
                        else drawn_mean_reward(groups, g.seed + 1, rl_steps, g.groups_per_step)),
        "dropped_groups": dropped, "continued_from": report.get("continued_from"),
        "trainer_stays": stays, "wall_s": time.time() - started})
    sha = env.broadcast(staged[1] if staged is not None else None)  # every rank decides alike what comes next
    if stays:
        held.run_dir, held.candidate_sha256 = run_dir, sha
        held.policies = env.broadcast(policy.carried(last_version=rl_steps) if policy is not None else None) or []
        held.carried_uids = remote.read_of({s for _, s in held.policies}) if remote is not None else set()
        return result, held
    if held.rewards is not None:
        held.rewards.close()
    return result, None


def publish_result(env: DistContext, args: argparse.Namespace, run_dir: Path, staged: tuple[Path, str],
                   fields: dict[str, Any]) -> dict[str, Any]:
    """Rank 0: result.json, then the candidate renamed into place (the node reads both when the
    candidate is there), and the policy pointer for rollout workers removed."""
    candidate = run_dir / CANDIDATE_NAME
    result = {"generation": args.generation, "candidate": str(candidate), "candidate_sha256": staged[1], **fields}
    result["final_loss"] = result["final"].get("loss")
    atomic_write_json(run_dir / RESULT_NAME, result, indent=2)
    publish_candidate(staged[0], candidate)
    (run_dir / POLICY_FILE).unlink(missing_ok=True)  # the run is over: rollout workers stop playing its policy
    say(env, f"done: candidate {candidate} ({staged[1][:12]}), final loss {result['final_loss']}")
    return result


def phase_steps(lm: LMConfig, has_parent: bool) -> tuple[int, int]:
    """(SFT steps, GRPO steps) of a generation. Generation 1 of `sft+rl` (no parent) is SFT
    alone: the gate then scores the SFT model by itself, and GRPO starts in generation 2 from
    the promoted SFT model. Before, generation 1 also ran its GRPO steps, on rollouts of the
    random init when stored (no signal: wasted) and on the SFT weights' own rollouts when
    online, so online GRPO's gain was folded into "SFT": on the user task the SFT generation
    came out at the GRPO level and no later generation could beat it with significance
    (docs/benchmarks/grpo_loop.md). `mode: rl` trains GRPO from the first generation on."""
    g = lm.grpo
    if g.mode == "sft+rl" and not has_parent:
        return g.sft.steps, 0
    return 0, g.steps


def heldout_line(env: DistContext, run_dir: Path, lm: LMConfig, task, tok, source: GeneratedGroups,
                 step: int) -> None:
    """Rank 0: the held-out prompts answered greedily by the trainer's engine, which holds the
    weights of `step` (synced after it), as a "heldout" line of the run's metrics."""
    if not env.is_main:
        return
    result = evaluate(source.engine, task, tok, heldout_prompts(task, lm.task), max_new_tokens=lm.eval.max_new_tokens)
    line = {"phase": "heldout", "step": step, "weight_version": source.engine.weight_version,
            "mean_reward": result.mean_reward, "exact_match": result.exact_match, "prompts": result.samples}
    with open(run_dir / "metrics.jsonl", "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")
    say(env, f"held-out at step {step}: reward {result.mean_reward:.4g} exact {result.exact_match:.4g}")


def online_source(lm: LMConfig, task, tok, sampler, rewards, env: DistContext, micro: int,
                  consumed: ConsumedGroups | None = None, generation: int = 0, policy: PolicyPublisher | None = None,
                  remote: RemoteGroups | None = None) -> GeneratedGroups:
    """`lm.grpo.rollouts: online`: each rank's in-process engine holds the trainer's weights,
    synced after every optimizer step with the step as their version; the rollout manager
    over-samples, filters and drops groups more than `lm.rollout.max_staleness` steps old, and
    groups already in the run's consumed record (a resumed run's replay). The sampling seed moves
    with the generation: a generation that starts again from the same best after a rejection must
    not draw the same rollouts (and so train the same candidate and get the same verdict) again;
    a resumed run of one generation keeps its seed. A run the node launched also publishes each
    step's weights for rollout workers on other nodes and takes their groups first (`policy`,
    `remote`: mesh_rollouts.py), within the same staleness bound."""
    from app.lm.rollout.engine import InProcessEngine

    g, r = lm.grpo, lm.rollout
    engine = InProcessEngine(sampler.to(env.device), tok, name="trainer")
    return GeneratedGroups(engine, task, tok, train_prompts(task, lm.task), seed=g.seed * 1_000_003 + generation,
                           prompts_per_step=g.groups_per_step, rollout=rollout_settings(r),
                           filters=LoopFilters(r.oversample, r.zero_variance, r.max_staleness), rewards=rewards,
                           micro_batch_size=micro, scale_by_std=g.scale_by_std, rank=env.rank,
                           world_size=env.world_size, consumed=consumed, policy=policy, remote=remote)


def log_dropped_groups(env: DistContext, run_dir: Path, dataset: Path) -> dict[str, int]:
    """The groups self-play's filter dropped while the dataset's were made (its manifest), also
    as the run's first metrics line, so the run's metrics file says what it trained without."""
    dropped = read_rollout_manifest(dataset)[0].get("dropped_groups", {})
    metrics = run_dir / "metrics.jsonl"
    if env.is_main and not metrics.exists():
        with open(metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"phase": "rollouts", "dropped_groups": dropped}) + "\n")
    return dropped


@record
def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_rank(lambda env: run(args, env), args.device,
                    (LMTrainInputError, CheckpointDirError, ConsumedRecordError, *LMInputError),
                    "lm training", timeout_s=GROUP_TIMEOUT_S)

if __name__ == "__main__":
    sys.exit(main())
