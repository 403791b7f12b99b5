#!/usr/bin/env python3
"""Training speed: the trainer's step loop against a bare PyTorch loop, and torchrun overheads.

    python scripts/bench_train.py [--channels 64 --blocks 5 --batch 256 --steps 20 --rounds 3] [--device cuda]

Prints ONE JSON object:
- `step_loop`: samples/s of `app.games.train.trainer.Trainer.train_step` (1 rank, DDP over gloo,
  or NCCL with `--device cuda`)
  and of a bare loop (same model weights, batches, AdamW, loss) run alternately in this
  process, and their ratio (target >= 0.9);
- `layout`: samples/s of the bare loop with the network's channels-last weights and input (what
  `PolicyValueNet` does) and with the default NCHW layout, alternately, and their ratio;
- `torchrun`: wall seconds of a no-op job under the launcher (start-up), and for 1 and 2 CPU
  ranks (with `--device cuda`: 1 and one per GPU) of the real trainer: time to the first step
  and steady samples/s from metrics.jsonl.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.games.search.model import Architecture, PolicyValueNet, new_model  # noqa: E402
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB  # noqa: E402
from app.games import get_game  # noqa: E402
from app.games.train.dataset import Arrays, load_dataset  # noqa: E402
from app.games.train.export import export_dataset  # noqa: E402
from app.shared.launcher import LaunchSpec, launch  # noqa: E402
from app.shared.process_group import DEVICE_CHOICES, init_distributed, network_device, shutdown, visible_gpus  # noqa: E402
from app.games.train.train_task import PolicyValueTask  # noqa: E402
from app.games.train.trainer import Trainer  # noqa: E402


def random_games_dataset(directory: Path, games: int, seed: int = 0) -> Path:
    """A dataset of random-play games with one-hot visit targets (content is irrelevant to speed)."""
    game = get_game("connect4")
    rng = np.random.default_rng(seed)
    records = []
    for i in range(games):
        state, moves = game.initial_state(), []
        while not state.is_terminal:
            action = int(rng.choice(state.legal_moves()))
            moves.append(MoveRecord(action, np.eye(game.num_actions)[action].tolist(), 0.0))
            state = state.play(action)
        records.append(GameRecord(f"bench-{i}", game.name, moves, state.winner, finished_at=float(i + 1)))
    with ReplayDB(directory / "games.db") as db:
        db.add_games(records)
    export_dataset([directory / "games.db"], directory / "ds", window_games=games, holdout_fraction=0.05)
    return directory / "ds"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a wall-clock time covers it (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(model: torch.nn.Module, data: dict[str, torch.Tensor], batches: list[torch.Tensor], lr: float, wd: float,
              forward=None):
    """The reference: what one would write by hand, no DDP, no bookkeeping."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=wd)
    forward = forward or model
    model.train()

    device = next(model.parameters()).device

    def run(step_batches: list[torch.Tensor]) -> float:
        synchronize(device)
        start = time.perf_counter()
        for idx in step_batches:
            planes, policy, value = (data[k].index_select(0, idx) for k in ("planes", "policy", "value"))
            logits, v = forward(planes)
            loss = -(policy * torch.log_softmax(logits, -1)).sum(-1).mean() + torch.mean((v - value) ** 2)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        synchronize(device)
        return time.perf_counter() - start

    return run


def bench_step_loop(train: Arrays, args: argparse.Namespace) -> dict:
    ctx = init_distributed(args.device)  # a one-rank group as the trainer joins it
    game = get_game("connect4")
    arch = Architecture(args.channels, args.blocks, game.plane_shape, game.num_actions)
    model = new_model(arch, seed=0)
    reference = copy.deepcopy(model).to(ctx.device)
    trainer = Trainer(ctx, model, PolicyValueTask(), train, Arrays.empty(game.plane_shape, game.num_actions),
                      batch_size=args.batch, micro_batches=1, lr=1e-3, weight_decay=1e-4, seed=0)
    data = trainer.train_data
    n = args.steps
    ours, bare = [], []
    ref_run = bare_loop(reference, data, [], 1e-3, 1e-4)
    trainer.train_step()  # warm-up both (allocator, DDP buckets)
    ref_run([trainer.global_batch()])
    for _ in range(args.rounds):
        batches = []
        start_step = trainer.step
        synchronize(ctx.device)
        t0 = time.perf_counter()
        for _ in range(n):
            batches.append(trainer.global_batch())
            trainer.train_step()
        synchronize(ctx.device)
        ours.append(n * trainer.batch_size / (time.perf_counter() - t0))
        assert trainer.step == start_step + n
        bare.append(n * trainer.batch_size / ref_run(batches))
    shutdown()
    ratios = [a / b for a, b in zip(ours, bare)]
    return {"trainer_samples_per_s": round(statistics.median(ours), 1),
            "bare_samples_per_s": round(statistics.median(bare), 1),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "batch": trainer.batch_size, "steps_per_round": n, "rounds": args.rounds,
            "model": f"{args.channels}x{args.blocks}", "device": str(ctx.device)}


def default_layout_forward(net: PolicyValueNet):
    """The network's forward without its channels-last input (use it with contiguous weights):
    the default NCHW layout that the network's own channels-last layout replaced."""
    def forward(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = net.tower(net.stem(x))
        return net.policy_head(h), net.value_head(h).squeeze(-1)
    return forward


def bench_layout(train: Arrays, args: argparse.Namespace) -> dict:
    game = get_game("connect4")
    arch = Architecture(args.channels, args.blocks, game.plane_shape, game.num_actions)
    device = network_device(args.device)
    data = {"planes": torch.from_numpy(train.planes).to(device), "policy": torch.from_numpy(train.policy).to(device),
            "value": torch.from_numpy(train.value).to(device)}
    nhwc_net = new_model(arch, seed=0).to(device)
    nchw_net = new_model(arch, seed=0).to(device, memory_format=torch.contiguous_format)
    nhwc = bare_loop(nhwc_net, data, [], 1e-3, 1e-4)
    nchw = bare_loop(nchw_net, data, [], 1e-3, 1e-4, forward=default_layout_forward(nchw_net))
    gen = torch.Generator().manual_seed(0)
    batch = min(args.batch, len(train))
    warm = [torch.randperm(len(train), generator=gen)[:batch].to(device)]
    nhwc(warm), nchw(warm)
    fast, slow = [], []
    for _ in range(args.rounds):
        batches = [torch.randperm(len(train), generator=gen)[:batch].to(device) for _ in range(args.steps)]
        slow.append(args.steps * batch / nchw(batches))
        fast.append(args.steps * batch / nhwc(batches))
    ratios = [a / b for a, b in zip(fast, slow)]
    return {"channels_last_samples_per_s": round(statistics.median(fast), 1),
            "nchw_samples_per_s": round(statistics.median(slow), 1),
            "ratio": round(statistics.median(ratios), 3), "ratios": [round(r, 3) for r in ratios],
            "batch": batch, "model": f"{args.channels}x{args.blocks}", "device": str(device)}


def bench_torchrun(dataset: Path, work: Path, args: argparse.Namespace) -> dict:
    noop = work / "noop.py"
    noop.write_text("import torch\n")
    out: dict = {}
    for nproc in (1, 2):
        t0 = time.monotonic()
        result = launch(LaunchSpec(target=[str(noop)], nproc=nproc, log_dir=work / f"noop{nproc}",
                                   status_every_s=0), out=io.StringIO())
        out[f"noop_wall_s_{nproc}rank"] = round(time.monotonic() - t0, 2)
        out[f"noop_all_ranks_started_s_{nproc}rank"] = round(result.startup_s or -1, 2)
    gpus = visible_gpus() if args.device != "cpu" else 0
    rank_counts = sorted({1, gpus}) if gpus else [1, 2]  # NCCL: one GPU per rank
    for nproc in rank_counts:
        run_dir = work / f"run{nproc}"
        t0 = time.time()
        launch(LaunchSpec(target=["-m", "app.games.train.train", "--dataset", str(dataset), "--run-dir", str(run_dir),
                                  "--channels", str(args.channels), "--blocks", str(args.blocks),
                                  "--batch-size", str(args.batch), "--micro-batches", "2", "--epochs", "1000",
                                  "--max-steps", str(args.torchrun_steps), "--log-every", "5",
                                  "--eval-every", "100000", "--device", args.device],
                          nproc=nproc, log_dir=run_dir / "logs", status_every_s=0), out=io.StringIO())
        events = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [e for e in events if e["event"] == "step"]
        out[f"train_{nproc}rank_first_step_s"] = round(steps[0]["time"] - t0, 2)
        out[f"train_{nproc}rank_samples_per_s"] = round(statistics.median(e["samples_per_s"] for e in steps[1:]), 1)
    if len(rank_counts) > 1:
        n = rank_counts[-1]
        out[f"speedup_{n}_vs_1_rank"] = round(out[f"train_{n}rank_samples_per_s"] / out["train_1rank_samples_per_s"], 3)
    out["cpu_cores"] = os.cpu_count()
    out["device"] = args.device
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--games", type=int, default=400)
    parser.add_argument("--torchrun-steps", type=int, default=30)
    parser.add_argument("--skip-torchrun", action="store_true")
    parser.add_argument("--device", choices=DEVICE_CHOICES, default="cpu",
                        help="where the step loops and the torchrun trainer run (cuda: NCCL, one rank per GPU)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        dataset = random_games_dataset(work, args.games)
        train = load_dataset(dataset).train
        report = {"step_loop": bench_step_loop(train, args), "layout": bench_layout(train, args)}
        if not args.skip_torchrun:
            report["torchrun"] = bench_torchrun(dataset, work, args)
    report["torch"] = torch.__version__
    print(json.dumps(report))


if __name__ == "__main__":
    main()
