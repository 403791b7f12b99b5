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

`--vs-bare` instead measures the demo model (configs/lm_demo.yaml: the Qwen2 with its BPE
tokenizer, built offline into a temporary directory) at one rank against a bare `transformers`
loop in the same process, step by step in turn: our step (the in-process engine's rollouts,
LocalBackend's GRPO update, the weight sync) and then, on the very same prompts and rows,
`model.generate` (pure sampling at the same temperature and length, on the weights our engine
holds) and a plain forward,
policy-gradient loss, backward and AdamW step. Reports tokens/s of each (medians over the steps) and their
ratios (ours / bare; the aim is >= 0.9), the ratio of each side's fastest step too (on a shared
machine noise only slows a step down), and our step's split.
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
    from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
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
                             prompts_per_step=args.prompts_per_step, rollout=rollout, micro_batch_size=64,
                             filters=LoopFilters(1.0, "keep", 1))  # every group trains: the work measured before
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


def vs_bare(args: argparse.Namespace) -> dict:
    """Ours against a bare transformers loop on the demo model, interleaved per step (see the doc)."""
    import copy
    import statistics
    import time
    import warnings

    import torch
    import yaml

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning)
    from app.config.lm import LMConfig
    from app.lm.demo_model import make_demo
    from app.lm.rollout.engine import InProcessEngine
    from app.lm.setup import check_inputs, initial_model, rollout_settings, train_prompts
    from app.lm.train.backend import LocalBackend, OptimConfig
    from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
    from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
    from app.lm.train.sft_grpo import grpo_step
    from app.log import configure_logging

    configure_logging(level="WARNING")
    with tempfile.TemporaryDirectory() as tmp:
        demo = make_demo(Path(tmp))
        raw = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "lm_demo.yaml").read_text())["lm"]
        raw["model"]["path"], raw["task"]["path"] = str(demo["model"]), str(demo["prompts"])
        lm = LMConfig.model_validate(raw)
        tok, task = check_inputs(lm)
        model = initial_model(lm.model, tok)
    rollout = rollout_settings(lm.rollout)
    bare = copy.deepcopy(model).train()
    sampler = copy.deepcopy(model).eval()  # bare generate on our engine's weights: the same lengths to sample
    bare_optim = torch.optim.AdamW(bare.parameters(), lr=lm.grpo.lr)
    backend = LocalBackend(model, OptimConfig(lr=lm.grpo.lr, max_grad_norm=None), sft_loss)
    source = GeneratedGroups(InProcessEngine(copy.deepcopy(model), tok), task, tok, train_prompts(task, lm.task),
                             seed=0, prompts_per_step=args.prompts_per_step, rollout=rollout,
                             filters=LoopFilters(1.0, "keep", 1))  # the bare loop trains every group too
    taken: list = []
    batch_of = source.batch
    source.batch = lambda backend, step: taken.append(batch_of(backend, step)) or taken[-1]  # type: ignore[method-assign]
    loss_fn = grpo_loss_fn(GRPOConfig(), rollout.temperature)
    pad, eos = tok.pad_token_id, tok.eos_token_id
    rows_of: dict[str, list[float]] = {k: [] for k in ("ours_rollout", "bare_rollout", "ours_train", "bare_train")}
    split = {"rollout_s": 0.0, "train_s": 0.0, "sync_s": 0.0}
    source.begin(backend, 0)
    for step in range(1, args.warmup + args.steps + 1):
        stats = grpo_step(backend, source, pad, loss_fn, step)
        rows = taken.pop().rows
        prompts = [r.tokens[:r.loss_mask.index(1)] for r in rows]  # each sample's prompt, n per group
        width = max(map(len, prompts))
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
        sampler.load_state_dict(source.engine.model.state_dict())
        t0 = time.perf_counter()
        with torch.no_grad():
            out = sampler.generate(input_ids=ids, attention_mask=(ids != pad).long() if pad != eos else None,
                                do_sample=True, temperature=rollout.temperature, top_k=0, top_p=1.0,
                                max_new_tokens=rollout.max_new_tokens, eos_token_id=eos, pad_token_id=pad)
        t1 = time.perf_counter()
        new = out[:, width:]
        ended = (new == eos).long().cumsum(-1)
        generated = int(((ended == 0) | ((ended == 1) & (new == eos))).sum())  # up to and with the eos
        longest = max(len(r.tokens) for r in rows)
        x = torch.tensor([r.tokens + [pad] * (longest - len(r.tokens)) for r in rows])
        m = torch.tensor([r.loss_mask + [0] * (longest - len(r.tokens)) for r in rows], dtype=torch.float32)
        adv = torch.tensor([r.advantage for r in rows])
        t2 = time.perf_counter()
        logits = bare(input_ids=x, attention_mask=(torch.arange(longest) < torch.tensor(
            [len(r.tokens) for r in rows])[:, None]).long()).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, x[:, 1:, None]).squeeze(-1)
        loss = -(adv[:, None] * logp * m[:, 1:]).sum() / m.sum().clamp(min=1)
        loss.backward()
        bare_optim.step()
        bare_optim.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        if step <= args.warmup:
            continue
        rows_of["ours_rollout"].append(stats["generated_tokens"] / stats["rollout_s"])
        rows_of["ours_train"].append(stats["trained_tokens"] / stats["train_s"])
        rows_of["bare_rollout"].append(generated / (t1 - t0))
        rows_of["bare_train"].append(float(m.sum()) / (t3 - t2))
        for k in split:
            split[k] += stats[k]
    med = {k: statistics.median(v) for k, v in rows_of.items()}
    best = {k: max(v) for k, v in rows_of.items()}  # each side's least disturbed step: a shared machine's noise only slows
    total = sum(split.values())
    return {"model": f"demo {type(model).__name__}, {sum(p.numel() for p in model.parameters())} params",
            "steps": args.steps, "rows_per_step": args.prompts_per_step * rollout.n,
            "max_new_tokens": rollout.max_new_tokens,
            "rollout_tokens_per_s": {"ours": med["ours_rollout"], "bare": med["bare_rollout"],
                                     "ratio": med["ours_rollout"] / med["bare_rollout"],
                                     "ratio_of_best_steps": best["ours_rollout"] / best["bare_rollout"]},
            "training_tokens_per_s": {"ours": med["ours_train"], "bare": med["bare_train"],
                                      "ratio": med["ours_train"] / med["bare_train"],
                                      "ratio_of_best_steps": best["ours_train"] / best["bare_train"]},
            "step_s": total / args.steps, "share": {k.removesuffix("_s"): v / total for k, v in split.items()}}


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
    p.add_argument("--vs-bare", action="store_true",
                   help="the demo model at one rank against a bare transformers loop (tokens/s ratios)")
    p.add_argument("--result", help=argparse.SUPPRESS)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.vs_bare:
        import os

        print(json.dumps({"benchmark": "grpo_vs_bare", "load_avg_1m": os.getloadavg()[0], **vs_bare(args)}))
        return 0
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
