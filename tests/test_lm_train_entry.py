"""The LM workload's training entry point under real torchrun (app.shared.launcher): generation 1
(SFT on demonstrations alone: GRPO starts from the SFT model in generation 2) at one rank, generation 2 from its
candidate on that candidate's own rollouts at two FSDP2 ranks on gloo, a finished run left
alone, and a corrupt dataset refused by its path.

Generation 2's rollouts come from the very weights it starts from, so its first GRPO step is
on-policy: the importance ratio against the stored log-probs must be 1 and nothing clipped.
That pins the off-policy bookkeeping (shift, masks, temperature) end to end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from app.config import load_settings
from app.db.rollout_store import RolloutStore
from app.lm.rollout.engine import InProcessEngine
from app.lm.causal_lm import load_model
from app.lm.workload.heldout import greedy_scores
from app.lm.rollout.rollout_dataset import export_rollouts
from app.lm.model_dir import verify_model_dir
from app.lm.rollout.batches import rollout_batch
from app.lm.setup import (
    build_task,
    build_tokenizer,
    greedy_settings,
    heldout_prompts,
    initial_model,
    rollout_settings,
    train_prompts,
)
from app.lm.train.generation import CANDIDATE_NAME, RESULT_NAME
from app.lm.train.continuation import continued_checkpoint
from app.shared.trainer_follow import FollowRequest, write_request
from tests.orchestrator_helpers import wait_until

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # real torchrun runs
torch.set_num_threads(1)
RL_STEPS = 4


def make_config(tmp: Path) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "lm_copy.yaml").read_text())
    lm = data["lm"]
    lm["task"].update(train_prompts=128, heldout_prompts=32)
    lm["rollout"].update(n=4)
    lm["grpo"].update(steps=RL_STEPS, groups_per_step=4, micro_batches=2, rollouts="stored")  # online: its own test
    lm["grpo"]["sft"].update(steps=60)  # the test resumes mid-SFT (step 40 of 60) and expects it to copy
    path = tmp / "lm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def make_dataset(config: Path, model, out: Path, seed: int) -> Path:
    """16 groups of 4 completions sampled by `model`, stored and exported as the pipeline does."""
    lm = load_settings(config).lm
    tok, task = build_tokenizer(lm.tokenizer), build_task(lm.task)
    engine = InProcessEngine(model, tok)
    with RolloutStore(out.parent / f"{out.name}.db") as store:
        rollout_batch(engine, task, tok, train_prompts(task, lm.task)[:16], rollout_settings(lm.rollout), store,
                      node_id="n1", model_id=f"m{seed}", seed=seed)
        return export_rollouts(store, out, window_groups=64).path


def train(config: Path, dataset: Path, run_dir: Path, generation: int, nproc: int,
          parent: Path | None = None, checkpoint_every: int = 10,
          continue_from: Path | None = None, keep_checkpoints: bool = False) -> subprocess.CompletedProcess:
    cmd = train_command(config, dataset, run_dir, generation, nproc, parent, checkpoint_every, continue_from)
    cmd += ["--keep-checkpoints"] if keep_checkpoints else []
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False, env=TRAIN_ENV)


TRAIN_ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def train_command(config: Path, dataset: Path, run_dir: Path, generation: int, nproc: int,
                  parent: Path | None = None, checkpoint_every: int = 10,
                  continue_from: Path | None = None) -> list[str]:
    cmd = [sys.executable, "-m", "app.shared.launcher", "--nproc", str(nproc), "--log-dir", str(run_dir / "logs"),
           "--status-every", "0", "--timeout-s", "200", "--module", "app.lm.train.generation", "--",
           "--dataset", str(dataset), "--run-dir", str(run_dir), "--resume", "auto",
           "--generation", str(generation), "--config", str(config), "--checkpoint-every", str(checkpoint_every)]
    if parent is not None:
        cmd += ["--parent", str(parent)]
    if continue_from is not None:
        cmd += ["--continue-from", str(continue_from)]
    return cmd


def heldout_exact(config: Path, model) -> float:
    lm = load_settings(config).lm
    tok, task = build_tokenizer(lm.tokenizer), build_task(lm.task)
    scores = greedy_scores(InProcessEngine(model, tok), task, tok, heldout_prompts(task, lm.task), greedy_settings(lm))
    return sum(scores.exact) / len(scores.exact)


def rl_lines(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if m["phase"] == "rl"]


@pytest.fixture(scope="module")
def gen1(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(config, dataset, run dir) of generation 1, trained at one rank."""
    tmp = tmp_path_factory.mktemp("lm-train")
    config = make_config(tmp)
    lm = load_settings(config).lm
    dataset = make_dataset(config, initial_model(lm.model, build_tokenizer(lm.tokenizer)), tmp / "data1", seed=1)
    run_dir = tmp / "gen1"
    proc = train(config, dataset, run_dir, 1, nproc=1, keep_checkpoints=True)  # a killed run's state is made from them
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return config, dataset, run_dir


def test_generation_one_is_sft_alone_and_writes_a_verified_candidate_that_copies(gen1):
    config, _, run_dir = gen1
    result = json.loads((run_dir / RESULT_NAME).read_text())
    candidate = run_dir / CANDIDATE_NAME
    assert verify_model_dir(candidate, result["candidate_sha256"]) is None
    assert result["generation"] == 1 and result["parent_sha256"] is None
    sft_steps = load_settings(config).lm.grpo.sft.steps
    assert result["sft_steps"] == sft_steps and result["rl_steps"] == 0  # no GRPO on the random init's rollouts
    assert len(result["dataset_sha256"]) == 64 and result["final"]["step"] == sft_steps
    assert result["mean_reward"] is None and not (run_dir / "rl").exists()
    assert not list(run_dir.glob(".staging-*"))
    lm = load_settings(config).lm
    before = heldout_exact(config, initial_model(lm.model, build_tokenizer(lm.tokenizer)))
    after = heldout_exact(config, load_model(candidate))
    assert before < 0.15 and after >= 0.5, (before, after)


def test_generation_two_on_two_fsdp_ranks_from_the_candidate_then_a_rerun_is_a_no_op(gen1, tmp_path: Path):
    config, _, run1 = gen1
    parent = run1 / CANDIDATE_NAME
    parent_sha = json.loads((run1 / RESULT_NAME).read_text())["candidate_sha256"]
    dataset = make_dataset(config, load_model(parent), tmp_path / "data2", seed=2)
    run_dir = tmp_path / "gen2"
    proc = train(config, dataset, run_dir, 2, nproc=2, parent=parent, checkpoint_every=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # a checkpoint every 2 steps, the newest kept (a resume reads nothing older; each is ~3x the model)
    assert [p.name for p in sorted((run_dir / "rl").glob("step_*"))] == [f"step_{RL_STEPS:08d}"]
    result = json.loads((run_dir / RESULT_NAME).read_text())
    assert verify_model_dir(run_dir / CANDIDATE_NAME, result["candidate_sha256"]) is None
    assert result["parent_sha256"] == parent_sha and result["world_size"] == 2
    assert result["sft_steps"] == 0 and not (run_dir / "sft").exists()
    assert result["trainer_stays"] is False  # launched without --follow: it ends with the generation
    first = rl_lines(run_dir)[0]
    assert first["step"] == 1 and abs(first["mean_ratio"] - 1.0) < 1e-3 and first["clip_fraction"] == 0.0, first

    again = train(config, dataset, run_dir, 2, nproc=1, parent=parent)
    assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout[-2000:]
    assert json.loads((run_dir / RESULT_NAME).read_text()) == result
    assert len(rl_lines(run_dir)) == RL_STEPS

    # generation 3 trains on from generation 2 at one rank: its weights and its optimizer's state
    # (AdamW's 4 steps), as a trainer that never stopped; a run dir whose candidate is not the
    # parent is not continued
    run3, follow = tmp_path / "gen3", tmp_path / "follow.json"
    cmd = train_command(config, dataset, run3, 3, nproc=1, parent=run_dir / CANDIDATE_NAME, continue_from=run_dir)
    trainer = subprocess.Popen([*cmd, "--follow", str(follow)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, env=TRAIN_ENV, start_new_session=True)
    try:
        wait_until(lambda: (run3 / CANDIDATE_NAME).exists() or trainer.poll() is not None, 200, what="generation 3")
        continued = json.loads((run3 / RESULT_NAME).read_text())["continued_from"]
        assert continued["checkpoint"].endswith(f"rl/step_{RL_STEPS:08d}") and continued["optimizer_steps"] == RL_STEPS
        assert continued_checkpoint(run_dir, parent_sha) == (None, f"{run_dir}'s candidate is not the parent")
        # the trainer stays (app/shared/trainer_follow.py): generation 4, whose parent is its own
        # candidate, is handed to it and trained on with the weights and optimizer it holds
        assert json.loads((run3 / RESULT_NAME).read_text())["trainer_stays"] is True
        assert trainer.poll() is None
        sha3, run4 = json.loads((run3 / RESULT_NAME).read_text())["candidate_sha256"], tmp_path / "gen4"
        write_request(follow, FollowRequest(4, str(run4), str(dataset), str(run3 / CANDIDATE_NAME), sha3))
        wait_until(lambda: (run4 / CANDIDATE_NAME).exists() or trainer.poll() is not None, 200, what="generation 4")
        result4 = json.loads((run4 / RESULT_NAME).read_text())
        assert result4["continued_from"] == {"in_memory": str(run3), "optimizer_steps": 2 * RL_STEPS}, result4
        assert result4["parent_sha256"] == sha3 and len(rl_lines(run4)) == RL_STEPS
        assert verify_model_dir(run4 / CANDIDATE_NAME, result4["candidate_sha256"]) is None
        # a generation from another parent is declined: the trainer ends, the node launches anew
        write_request(follow, FollowRequest(5, str(tmp_path / "gen5"), str(dataset), str(parent), parent_sha))
        out = trainer.communicate(timeout=120)[0]
        assert trainer.returncode == 0 and "not from this trainer's candidate" in out, out[-3000:]
        assert not (tmp_path / "gen5").exists()
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()


def test_a_corrupt_dataset_is_refused_by_its_path(gen1, tmp_path: Path):
    config, dataset, _ = gen1
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in dataset.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    groups = bad / "groups.jsonl"
    raw = bytearray(groups.read_bytes())
    raw[10] ^= 0x01
    groups.write_bytes(bytes(raw))
    proc = train(config, bad, tmp_path / "run", 1, nproc=1)
    assert proc.returncode != 0
    assert str(groups) in proc.stdout + proc.stderr
    assert not (tmp_path / "run" / CANDIDATE_NAME).exists()


def test_a_run_killed_mid_sft_resumes_from_its_newest_complete_checkpoint_to_the_same_candidate(gen1, tmp_path: Path):
    """The state a kill during SFT leaves: checkpoints up to step 40, a torn staging copy and a
    step directory without its marker (newer, so only the marker rule keeps it out), no candidate."""
    config, dataset, run1 = gen1
    run_dir = tmp_path / "gen1-killed"
    shutil.copytree(run1, run_dir)
    for gone in ("candidate", "result.json", "sft/step_00000050", "sft/step_00000060"):
        shutil.rmtree(run_dir / gone) if (run_dir / gone).is_dir() else (run_dir / gone).unlink()
    shutil.copytree(run_dir / "sft" / "step_00000040", run_dir / "sft" / "step_00000070")
    (run_dir / "sft" / "step_00000070" / "COMPLETE").unlink()
    shutil.copytree(run_dir / "sft" / "step_00000040", run_dir / "sft" / ".staging-step_00000050")
    logged = len((run_dir / "metrics.jsonl").read_text().splitlines())
    proc = train(config, dataset, run_dir, 1, nproc=1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "SFT steps 41..60" in proc.stdout
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert lines[0] == {"phase": "rollouts", "dropped_groups": lines[0]["dropped_groups"]}  # what self-play dropped
    original = {(m["phase"], m["step"]): m["loss"] for m in lines[1:logged]}
    resumed = lines[logged:]
    assert [(m["phase"], m["step"]) for m in resumed] == [("sft", s) for s in range(41, 61)]
    for m in resumed:  # the same trajectory as the unbroken run
        assert m["loss"] == pytest.approx(original[(m["phase"], m["step"])], rel=1e-5, abs=1e-7), m
    result = json.loads((run_dir / RESULT_NAME).read_text())
    assert verify_model_dir(run_dir / CANDIDATE_NAME, result["candidate_sha256"]) is None
    unbroken = json.loads((run1 / RESULT_NAME).read_text())
    assert result["candidate_sha256"] == unbroken["candidate_sha256"]  # bit-identical weights on CPU
    assert result["final"] == unbroken["final"] and result["mean_reward"] == unbroken["mean_reward"]


def consumed_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for f in sorted((run_dir / "consumed").glob("rank_*.jsonl"))
            for line in f.read_text().splitlines()]


@pytest.mark.timeout(600)  # two 2-rank runs: the whole generation, then its resume
def test_online_rollouts_follow_the_trainer_step_by_step_on_two_fsdp_ranks(gen1, tmp_path: Path):
    """`lm.grpo.rollouts: online`: each step's groups are generated by the weights
    of the step before (version = step - 1, so staleness 0), the ratio of step 1 is 1 and
    nothing is clipped, and the candidate is a verified directory. Then the state a kill -9
    after step 4 trained but before its checkpoint leaves: the run resumes from step 2's
    checkpoint with its engines re-synced to those weights (version 2), replays its rounds and
    drops the groups the consumed record says steps 3 and 4 trained: no group uid twice."""
    config, dataset, run1 = gen1
    data = yaml.safe_load(config.read_text())
    data["lm"]["grpo"].update(eval_every=2)
    data["lm"]["grpo"]["rollouts"] = "online"
    online = tmp_path / "online.yaml"
    online.write_text(yaml.safe_dump(data))
    run_dir = tmp_path / "gen2-online"
    proc = train(online, dataset, run_dir, 2, nproc=2, parent=run1 / CANDIDATE_NAME, checkpoint_every=2,
                 keep_checkpoints=True)  # the killed state below is made from them
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((run_dir / RESULT_NAME).read_text())
    assert result["rollouts"] == "online" and result["world_size"] == 2
    assert verify_model_dir(run_dir / CANDIDATE_NAME, result["candidate_sha256"]) is None
    lines = rl_lines(run_dir)
    assert [m["step"] for m in lines] == list(range(1, RL_STEPS + 1))
    assert [m["weight_version"] for m in lines] == list(range(RL_STEPS))  # the trainer's newest, every step
    assert abs(lines[0]["mean_ratio"] - 1.0) < 1e-5 and lines[0]["clip_fraction"] == 0.0, lines[0]
    heldout = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    heldout = [m for m in heldout if m["phase"] == "heldout"]
    assert [(m["step"], m["weight_version"]) for m in heldout] == [(2, 2), (4, 4)]  # the trainer's own weights
    assert all(0.0 <= m["mean_reward"] <= 1.0 and m["prompts"] == 32 for m in heldout)
    assert all(m["staleness_groups"] == [4, 0] for m in lines)  # 4 groups a step, none a version old (bound 0)
    trained = consumed_lines(run_dir)
    assert sorted(m["step"] for m in trained) == [1, 1, 2, 2, 3, 3, 4, 4]  # each rank, each step

    killed = tmp_path / "gen2-killed"
    shutil.copytree(run_dir, killed)
    for gone in ("candidate", "result.json", "rl/step_00000004"):
        shutil.rmtree(killed / gone) if (killed / gone).is_dir() else (killed / gone).unlink()
    proc = train(online, dataset, killed, 2, nproc=2, parent=run1 / CANDIDATE_NAME, checkpoint_every=2)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    resumed = rl_lines(killed)[RL_STEPS:]
    assert [(m["step"], m["weight_version"]) for m in resumed] == [(3, 2), (4, 3)]  # re-synced to the resumed weights
    assert sum(m["dropped_consumed"] for m in resumed) >= 4, resumed  # the replayed groups of step 3 (both ranks)
    uids = [u for m in consumed_lines(killed) for u in m["uids"]]
    assert len(uids) == 6 * 4 and len(set(uids)) == len(uids)  # 6 steps of 4 groups (2 a rank), none twice
    assert verify_model_dir(killed / CANDIDATE_NAME, json.loads((killed / RESULT_NAME).read_text())[
        "candidate_sha256"]) is None
