#!/usr/bin/env python3
"""GRPO steps of the digit Llama: by rank count, and by engine. Prints ONE JSON object.

    python scripts/bench_grpo.py [--steps 20 --warmup 3 --prompts-per-step 8 --group-size 8] [--ranks 1,2]
                                 [--engines in_process,sglang,vllm] [--device auto|cpu|cuda]
                                 [--backend auto|local|fsdp]

`runs` (per rank count in `--ranks`, under torchrun through app.shared.launcher: 1 rank with
LocalBackend, more with FSDP2, every rank generating its share of each step's prompts with its
own in-process engine): rollout tokens/s (generated tokens of all ranks / rollout wall time),
training tokens/s (response tokens trained / training wall time), and the share of a step in
rollout, training and weight sync, over the measured steps after `--warmup` steps.

`engines` (per engine in `--engines`, one process): the online loop as scripts/sft_rl.py runs
it (the rollout manager with over-sampling 1.5, zero-variance groups dropped, overlong groups
dropped; rewards in a one-worker RewardPool), with the in-process engine (tensor sync) or an
SGLang / vLLM engine on a loopback stub server (tests/engine_stubs.py: the real routes; disk
sync, so each step writes a `save_pretrained` directory the server is told to load). Per step:
the seconds of rollout, reward, training and sync; for the HTTP engines also the time the
stub spent in its handlers (generation and load, which a real server would spend on the GPU)
and rollout / sync with it subtracted: what the loop itself costs around a server. And the
groups dropped, by reason, over the measured steps.
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
    source = GeneratedGroups(engine, task, tok, task.make_prompts(400, 1, "train"), seed=0,
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


def engine_run(kind: str, args: argparse.Namespace, work: Path) -> dict:
    """The online loop with one engine kind, in this process (a stub server in a thread)."""
    import asyncio
    import copy
    import threading

    import torch

    torch.set_num_threads(1)
    from app.lm.causal_lm import LMModelConfig, build_model
    from app.lm.reward_pool import RewardPool
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.rollout.groups import DROP_REASONS
    from app.lm.rollout.sglang_engine import SGLangEngine
    from app.lm.rollout.vllm_engine import VLLMEngine
    from app.lm.tasks import DigitTask
    from app.lm.tokenizer import build_digit_tokenizer
    from app.lm.train.backend import LocalBackend, OptimConfig
    from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
    from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
    from app.lm.train.sft_grpo import grpo_loop
    from app.lm.train.weight_publish import WeightPublisher
    from app.lm.truncation import RolloutSettings
    from tests.engine_stubs import SGLangStub, VLLMStub

    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(seed=0), tok)
    backend = LocalBackend(model, OptimConfig(lr=3e-3), sft_loss)
    stub, loop = None, None
    if kind == "in_process":
        engine = InProcessEngine(copy.deepcopy(model), tok)
    else:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
        stub = asyncio.run_coroutine_threadsafe((SGLangStub() if kind == "sglang" else VLLMStub()).start(),
                                                loop).result(30)
        engine = SGLangEngine("sg", stub.url) if kind == "sglang" else VLLMEngine("vl", stub.url)
    publish = WeightPublisher(backend.get_weights, model=backend.model, tokenizer=tok,
                              out_dir=work / kind if engine.sync_mode == "disk" else None)
    task = DigitTask("copy", 2, 4, "partial")  # 4-digit prompts (7 tokens) + 4 new tokens pass max_seq_len 10
    rollout = RolloutSettings(n=args.group_size, max_new_tokens=4, max_seq_len=10, overlong_group="drop_group",
                              length_is_parse_failure=False)
    rewards = RewardPool(task, workers=1, timeout_s=10.0)
    source = GeneratedGroups(engine, task, tok, task.make_prompts(400, 1, "train"), seed=0,
                             prompts_per_step=args.prompts_per_step, rollout=rollout, publish=publish, rewards=rewards,
                             filters=LoopFilters(oversample=1.5, zero_variance="drop", max_empty_rounds=32))
    busy_at_warmup: dict[str, float] = {}

    def after(step: int, stats: dict) -> None:
        if step == args.warmup and stub is not None:
            busy_at_warmup.update(stub.busy_s)

    try:
        history = grpo_loop(backend, source, tok.pad_token_id, grpo_loss_fn(GRPOConfig(), rollout.temperature),
                            args.warmup + args.steps, on_step=after)[args.warmup:]
    finally:
        rewards.close()
        if stub is not None and loop is not None:
            asyncio.run_coroutine_threadsafe(stub.stop(), loop).result(30)
            loop.call_soon_threadsafe(loop.stop)
    n = len(history)
    per_step = {k: sum(h[k] for h in history) / n for k in ("rollout_s", "reward_s", "train_s", "sync_s")}
    result = {"sync": engine.sync_mode, "steps": n, "per_step_s": per_step,
              "step_s": sum(per_step.values()),
              "generated_tokens_per_step": sum(h["generated_tokens"] for h in history) / n,
              "dropped_groups": {r: sum(h.get(f"dropped_{r}", 0) for h in history) for r in DROP_REASONS},
              "mean_reward_last": history[-1]["mean_reward"]}
    if stub is not None:
        busy = {p: stub.busy_s.get(p, 0.0) - busy_at_warmup.get(p, 0.0) for p in stub.busy_s}
        gen_paths = ("/generate", "/v1/completions")
        stub_gen = sum(v for p, v in busy.items() if p in gen_paths) / n
        stub_load = sum(v for p, v in busy.items() if p not in gen_paths) / n
        result["stub_s_per_step"] = {"generate": stub_gen, "load": stub_load}
        result["without_stub_s"] = {"rollout_s": per_step["rollout_s"] - stub_gen,
                                    "sync_s": per_step["sync_s"] - stub_load}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--prompts-per-step", type=int, default=8)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--ranks", default="1,2", help="rank counts of `runs` (empty: none)")
    p.add_argument("--engines", default="in_process,sglang,vllm", help="engine kinds of `engines` (empty: none)")
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

    from app.log import configure_logging

    configure_logging(level="WARNING")
    out = {"benchmark": "grpo", "model": "digit llama ~75k params",
           "task": "runs: copy 3 digits; engines: copy 2-4 digits, max_seq_len 10; partial credit",
           "prompts_per_step": args.prompts_per_step, "group_size": args.group_size,
           "load_avg_1m": os.getloadavg()[0], "runs": {}, "engines": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in [k for k in args.engines.split(",") if k]:
            out["engines"][kind] = engine_run(kind, args, Path(tmp))
        for nproc in [int(x) for x in args.ranks.split(",") if x]:
            result = Path(tmp) / f"r{nproc}.json"
            launch(LaunchSpec(target=[str(Path(__file__).resolve()), "--worker", "--steps", str(args.steps),
                                      "--warmup", str(args.warmup), "--prompts-per-step", str(args.prompts_per_step),
                                      "--group-size", str(args.group_size), "--result", str(result),
                                      "--device", args.device, "--backend", args.backend],
                              nproc=nproc, log_dir=Path(tmp) / f"logs{nproc}", status_every_s=0), out=io.StringIO())
            out["runs"][str(nproc)] = json.loads(result.read_text())
    out["load_avg_1m_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
