"""The trainer under real torchrun on CPU: 2-rank training, resuming across world sizes,
warm start, bad input; and the pure schedule it relies on.

What "resumes exactly" means here: the logged training loss of step s is the mean over the
whole global batch of s, and the batch, its split into `micro_batches` slices (BatchNorm
statistics are per slice) and the optimizer state are all independent of the world size.
So a run resumed from a step-k checkpoint on another number of ranks must log the same loss
as the uninterrupted run at every step after k. On CPU it is bit-identical (gradients are
scaled by powers of two); we assert equality to 1e-6 relative.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, strategies as st

from app.games.search.model import load_model, read_meta
from app.games.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from app.games.train.dataset import dataset_sha256
from app.games.train.export import export_dataset
from app.shared.launcher import LaunchSpec, launch
from app.games.train.train_schedule import (
    EarlyStop, ScheduleError, early_stop_update, effective_batch, epoch_permutation, rank_slices,
    resolve_micro_batches,
)
from tests.train_fixtures import make_db

ROOT = Path(__file__).resolve().parents[1]
STEPS = 40
COMMON = ["--channels", "16", "--blocks", "1", "--batch-size", "64", "--micro-batches", "2", "--lr", "0.003",
          "--max-steps", str(STEPS), "--epochs", "100", "--log-every", "1", "--eval-every", "10",
          "--checkpoint-every", "10", "--keep-checkpoints", "--patience", "0",
          "--device", "cpu"]  # the bit-identity is CPU's: on a GPU node 1 rank would take the GPU, 2 the CPU


def step_losses(run_dir: Path) -> dict[int, float]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if m["event"] == "step"]
    assert len({m["step"] for m in steps}) == len(steps), "a step was logged twice: more than one writer?"
    return {m["step"]: m["loss"] for m in steps}


def train(tmp: Path, name: str, nproc: int, dataset: Path, *extra: str) -> tuple[Path, str]:
    run_dir = tmp / name
    out = io.StringIO()
    launch(LaunchSpec(target=["-m", "app.games.train.train", "--dataset", str(dataset), "--run-dir", str(run_dir),
                              *COMMON, *extra],
                      nproc=nproc, log_dir=run_dir / "logs", timeout_s=150, status_every_s=0), out=out)
    return run_dir, out.getvalue()


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("train-data")
    make_db(base / "games.db", 150, seed=3)
    export_dataset([base / "games.db"], base / "ds", holdout_fraction=0.1, augment=True)
    return base / "ds"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, dataset: Path) -> dict[str, tuple[Path, str]]:
    """A: 2 ranks uninterrupted. C: 1 rank from A's step-10 checkpoint. E: 2 ranks from C's step-20."""
    tmp = tmp_path_factory.mktemp("runs")
    a = train(tmp, "A", 2, dataset)
    c = train(tmp, "C", 1, dataset, "--resume", str(a[0] / "checkpoint_step000010.pt"))
    e = train(tmp, "E", 2, dataset, "--resume", str(c[0] / "checkpoint_step000020.pt"))
    return {"A": a, "C": c, "E": e}


@pytest.mark.timeout(240)
def test_two_rank_run_trains_and_loss_falls(runs, dataset):
    run_dir, output = runs["A"]
    losses = step_losses(run_dir)
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = np.mean([losses[s] for s in range(1, 6)]), np.mean([losses[s] for s in range(STEPS - 4, STEPS + 1)])
    assert last < first - 0.05, (first, last)
    result = json.loads((run_dir / "result.json").read_text())
    assert result["world_size"] == 2 and result["steps"] == STEPS and result["status"] == "completed"
    meta = read_meta(run_dir / "candidate.safetensors")
    assert meta.dataset_sha256 == dataset_sha256(dataset) == result["dataset_sha256"]
    assert meta.parent_sha256 is None and meta.sha256 == result["candidate_sha256"]
    net, _ = load_model(run_dir / "candidate.safetensors", expect_game="connect4")
    assert sum(p.numel() for p in net.parameters()) > 0
    evals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert [e["step"] for e in evals] == [10, 20, 30, 40] and all(e["holdout_loss"] > 0 for e in evals)
    assert "[Rank 0] step 40/40" in output and "[launcher] rank 1 exited with code 0" in output
    assert (run_dir / "logs" / "rank_0.log").exists() and (run_dir / "logs" / "rank_1.log").exists()
    # only rank 0 writes: the run dir holds exactly rank 0's outputs
    written = sorted(p.name for p in run_dir.iterdir() if p.name != "logs")
    assert written == ["candidate.json", "candidate.safetensors", "checkpoint.pt", "checkpoint_step000010.pt",
                       "checkpoint_step000020.pt", "checkpoint_step000030.pt", "checkpoint_step000040.pt",
                       "metrics.jsonl", "result.json"]


@pytest.mark.timeout(240)
def test_checkpoint_from_two_ranks_resumes_on_one_with_the_same_losses(runs):
    a, c = step_losses(runs["A"][0]), step_losses(runs["C"][0])
    assert sorted(c) == list(range(11, STEPS + 1))
    np.testing.assert_allclose([c[s] for s in sorted(c)], [a[s] for s in sorted(c)], rtol=1e-6)
    assert load_checkpoint(runs["A"][0] / "checkpoint_step000010.pt")["world_size"] == 2
    assert json.loads((runs["C"][0] / "result.json").read_text())["world_size"] == 1


@pytest.mark.timeout(240)
def test_checkpoint_from_one_rank_resumes_on_two_with_the_same_losses(runs):
    a, e = step_losses(runs["A"][0]), step_losses(runs["E"][0])
    assert sorted(e) == list(range(21, STEPS + 1))
    np.testing.assert_allclose([e[s] for s in sorted(e)], [a[s] for s in sorted(e)], rtol=1e-6)
    ckpt = load_checkpoint(runs["C"][0] / "checkpoint_step000020.pt")
    assert ckpt["world_size"] == 1 and ckpt["step"] == 20 and ckpt["micro_batches"] == 2
    assert {"model", "optimizer", "rng", "epoch", "step_in_epoch", "early_stop", "dataset_sha256"} <= set(ckpt)
    # the published candidates agree too, whichever world size trained them
    weights = [load_model(runs[k][0] / "candidate.safetensors")[0].state_dict() for k in "ACE"]
    for name, tensor in weights[0].items():
        for other in weights[1:]:
            np.testing.assert_allclose(other[name].numpy(), tensor.numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.timeout(120)
def test_warm_start_names_parent_and_bad_checkpoint_is_refused(runs, dataset, tmp_path):
    parent = runs["A"][0] / "candidate.safetensors"
    parent_meta = read_meta(parent)
    run_dir = tmp_path / "warm"
    proc = subprocess.run(
        [sys.executable, "-m", "app.games.train.train", "--dataset", str(dataset), "--run-dir", str(run_dir),
         "--parent", str(parent), "--max-steps", "5", "--batch-size", "32", "--log-every", "1",
         "--eval-every", "1", "--patience", "1", "--min-delta", "100"],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 0, proc.stderr
    meta = read_meta(run_dir / "candidate.safetensors")
    assert meta.parent_sha256 == parent_meta.sha256 and meta.generation == parent_meta.generation + 1
    assert meta.architecture == parent_meta.architecture
    # early stopping: no evaluation after the first can beat the best by 100, so patience 1 stops at step 2
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "stopped_early" and result["steps"] == 2 and result["best_step"] == 1
    assert load_checkpoint(run_dir / "checkpoint.pt")["stopped_early"] is True
    # the first step starts from the parent's weights, so its loss is near the parent's last
    first = step_losses(run_dir)[1]
    assert first < step_losses(runs["A"][0])[1]

    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    # through the CLI and torchrun: the rank's exit code 2 and its message come back
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train.py"), "--dataset", str(dataset), "--run-dir",
         str(tmp_path / "r2"), "--nproc", "1", "--quiet", "--resume", str(bad), "--", "--max-steps", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )
    assert proc.returncode == 2, proc.stderr
    assert "rank 0 failed first with exit code 2" in proc.stderr
    assert f"training input error: {bad}: unreadable checkpoint" in proc.stderr
    assert not (tmp_path / "r2" / "candidate.safetensors").exists()


def test_checkpoint_file_roundtrip_and_errors(tmp_path):
    import torch
    path = save_checkpoint({"model": {"w": torch.ones(2)}, "optimizer": {}, "step": 7}, tmp_path / "c.pt")
    state = load_checkpoint(path)
    assert state["step"] == 7 and torch.equal(state["model"]["w"], torch.ones(2))
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temp file left
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "missing.pt")
    save_checkpoint({"model": {}}, tmp_path / "partial.pt")
    with pytest.raises(CheckpointError, match="lacks optimizer, step"):
        load_checkpoint(tmp_path / "partial.pt")


# ---- the pure schedule -----------------------------------------------------------------------


@given(st.integers(1, 6).flatmap(lambda w: st.tuples(st.just(w), st.integers(1, 5).map(lambda k: k * w))))
def test_rank_slices_partition_the_micro_batches(world_and_micro):
    world, micro = world_and_micro
    owned = [i for r in range(world) for i in rank_slices(micro, world, r)]
    assert owned == list(range(micro))


@given(st.integers(1, 8), st.integers(1, 8))
def test_rank_slices_refuse_uneven_splits(world, micro):
    if micro % world:
        with pytest.raises(ScheduleError, match=f"cannot split {micro} micro-batches"):
            rank_slices(micro, world, 0)
    else:  # an even split is accepted: every rank gets the same share
        assert [len(rank_slices(micro, world, r)) for r in range(world)] == [micro // world] * world
    with pytest.raises(ScheduleError, match=f"rank {world} of {world}"):
        rank_slices(micro, world, world)  # a rank outside the world, whatever the split


@given(st.integers(0, 16), st.integers(1, 8), st.one_of(st.none(), st.integers(1, 16)))
def test_resolve_micro_batches(requested, world, previous):
    if previous is None and requested and requested % world:
        with pytest.raises(ScheduleError, match=f"micro_batches={requested} is not a multiple of the world size {world}"):
            resolve_micro_batches(requested, world, previous)
        return
    micro, kept = resolve_micro_batches(requested, world, previous)
    assert micro % world == 0
    if previous is not None:
        assert kept == (previous % world == 0) and (not kept or micro == previous)


@given(st.integers(0, 10**6), st.integers(0, 50), st.integers(1, 300))
def test_epoch_permutation_is_a_deterministic_permutation(seed, epoch, n):
    perm = epoch_permutation(seed, epoch, n)
    assert sorted(perm.tolist()) == list(range(n))
    assert np.array_equal(perm, epoch_permutation(seed, epoch, n))


@given(st.integers(1, 4096), st.integers(1, 5000), st.integers(1, 8))
def test_effective_batch(requested, n, micro):
    if min(requested, n) < micro:
        with pytest.raises(ScheduleError, match=f"cannot fill {micro} micro-batches"):
            effective_batch(requested, n, micro)
        return
    size = effective_batch(requested, n, micro)
    assert size % micro == 0 and 0 < size <= min(requested, n) and min(requested, n) - size < micro


@given(st.lists(st.floats(0, 10, allow_nan=False), min_size=1, max_size=30), st.integers(0, 5))
def test_early_stop_matches_a_simple_reference(losses, patience):
    state = EarlyStop()
    best, since, stopped_at = float("inf"), 0, None
    for step, loss in enumerate(losses):
        state, improved, stop = early_stop_update(state, loss, step, patience)
        assert improved == (loss < best)
        if loss < best:
            best, since = loss, 0
        else:
            since += 1
        assert state.best_loss == best and state.evals_since_best == since
        assert stop == (patience > 0 and since >= patience)
        if stop and stopped_at is None:
            stopped_at = step
    assert stopped_at is None or patience > 0


def test_the_step_cap_comes_from_the_config_and_the_command_line_overrides_it(tmp_path: Path) -> None:
    """`train.max_steps` fixes a generation's training cost while the window grows (the
    pipeline passes only --config); --max-steps overrides it; a negative cap is refused."""
    from app.games.train.train import TrainInputError, build_parser, resolve_options

    config = tmp_path / "node.yaml"
    config.write_text("train: {max_steps: 7}\n")
    base = ["--dataset", "d", "--run-dir", "r", "--config", str(config)]
    assert resolve_options(build_parser().parse_args(base))["max_steps"] == 7
    assert resolve_options(build_parser().parse_args([*base, "--max-steps", "3"]))["max_steps"] == 3
    assert resolve_options(build_parser().parse_args(["--dataset", "d", "--run-dir", "r"]))["max_steps"] == 400
    with pytest.raises(TrainInputError, match="--max-steps must be >= 0, got -1"):
        resolve_options(build_parser().parse_args([*base, "--max-steps", "-1"]))
