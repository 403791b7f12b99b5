"""Checkpoint directories (atomic, newest complete by integer step), the four weight layouts,
and `sft+rl` continuing from the newest complete SFT checkpoint (LocalBackend, in process)."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from app.lm.rollout.engine import InProcessEngine
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.truncation import RolloutSettings
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.checkpoint_dirs import (
    COMPLETE,
    LATEST,
    CheckpointDirError,
    commit_dir,
    complete_checkpoints,
    prune_older,
    fresh_staging,
    newest_complete,
    read_latest,
    read_trainer_state,
)
from app.lm.train.grpo import sft_loss
from app.lm.train.hf_io import WeightsFormatError, load_weight_files
from app.lm.train.grpo import GRPOConfig, grpo_loss_fn
from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
from app.lm.train.sft_grpo import NoSFTCheckpoint, RunPlan, SFTConfig, run, sft_rows


def make_step(root: Path, name: str, complete: bool) -> Path:
    path = root / name
    path.mkdir(parents=True)
    if complete:
        (path / COMPLETE).write_text("{}")
    return path


def test_newest_complete_compares_steps_as_integers_and_needs_the_marker(tmp_path):
    make_step(tmp_path, "step_9", True)
    make_step(tmp_path, "step_10", True)
    make_step(tmp_path, "step_11", False)  # torn: no marker
    make_step(tmp_path, ".staging-step_12", True)
    make_step(tmp_path, "step_x", True)
    assert [s for s, _ in complete_checkpoints(tmp_path)] == [9, 10]
    assert newest_complete(tmp_path)[1].name == "step_10"
    assert newest_complete(tmp_path / "missing") is None
    with pytest.raises(CheckpointDirError, match="step_11"):
        read_trainer_state(tmp_path / "step_11")


def test_pruning_keeps_the_newest_complete_checkpoints_and_nothing_torn_counts(tmp_path):
    for name, complete in (("step_00000009", True), ("step_00000010", True), ("step_00000011", False)):
        make_step(tmp_path, name, complete)
    assert prune_older(tmp_path, 0) == []  # 0: every one kept
    assert prune_older(tmp_path, 1) == [tmp_path / "step_00000009"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000010", "step_00000011"]  # the torn one is not a checkpoint


def test_commit_makes_the_directory_and_pointer_appear_whole(tmp_path):
    staging = fresh_staging(tmp_path, "step_00000005")
    (staging / "payload").write_text("x")
    assert read_latest(tmp_path) is None and newest_complete(tmp_path) is None  # staging is invisible
    final = commit_dir(staging, tmp_path, "step_00000005", {"step": 5})
    assert (tmp_path / LATEST).read_text() == "step_00000005" and read_latest(tmp_path) == final
    assert json.loads((final / COMPLETE).read_text()) == {"step": 5} and not staging.exists()
    again = fresh_staging(tmp_path, "step_00000005")  # the same step saved again replaces it whole
    (again / "payload").write_text("y")
    commit_dir(again, tmp_path, "step_00000005", {"step": 5})
    assert (final / "payload").read_text() == "y"
    assert sorted(p.name for p in tmp_path.iterdir()) == [LATEST, "step_00000005"]


def test_weight_loaders_read_all_four_layouts(tmp_path):
    state = {"a.weight": torch.randn(3, 2), "b.bias": torch.randn(4)}
    layouts = {"safe": tmp_path / "safe", "safe_sharded": tmp_path / "ss", "bin": tmp_path / "bin",
               "bin_sharded": tmp_path / "bs"}
    for path in layouts.values():
        path.mkdir()
    save_file(state, str(layouts["safe"] / "model.safetensors"))
    torch.save(state, layouts["bin"] / "pytorch_model.bin")
    for kind, ext, writer in (("safe_sharded", "safetensors", lambda t, p: save_file(t, str(p))),
                              ("bin_sharded", "bin", lambda t, p: torch.save(t, p))):
        d = layouts[kind]
        prefix = "model" if ext == "safetensors" else "pytorch_model"
        writer({"a.weight": state["a.weight"]}, d / f"{prefix}-00001-of-00002.{ext}")
        writer({"b.bias": state["b.bias"]}, d / f"{prefix}-00002-of-00002.{ext}")
        index = {"metadata": {}, "weight_map": {"a.weight": f"{prefix}-00001-of-00002.{ext}",
                                                "b.bias": f"{prefix}-00002-of-00002.{ext}"}}
        (d / f"{prefix}.{ext}.index.json").write_text(json.dumps(index))
    for kind, path in layouts.items():
        got = load_weight_files(path)
        assert set(got) == set(state), kind
        for key in state:
            torch.testing.assert_close(got[key], state[key])
    (layouts["bin_sharded"] / "pytorch_model-00002-of-00002.bin").unlink()
    with pytest.raises(WeightsFormatError, match="00002-of-00002.bin"):
        load_weight_files(layouts["bin_sharded"])
    (layouts["safe"] / "model.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(WeightsFormatError, match="model.safetensors"):
        load_weight_files(layouts["safe"])
    with pytest.raises(WeightsFormatError, match="no model.safetensors"):
        load_weight_files(tmp_path)


SMALL = RunPlan(SFTConfig(steps=4, batch_size=8, micro_batch_size=8), 2e-3, 2, 2e-3, checkpoint_every=2)
PLANS = {"sft": replace(SMALL, rl_steps=0), "rl": replace(SMALL, sft=None), "sft+rl": SMALL}


def small_run(tmp_path: Path):
    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(seed=1), tok)
    backend = LocalBackend(model, OptimConfig(lr=2e-3), sft_loss)
    engine = InProcessEngine(copy.deepcopy(model), tok)
    return backend, engine, DigitTask("copy", 3, 3), tok, SMALL


def online(backend, engine, task, tok, run_dir: Path, plan: RunPlan) -> dict:
    """scripts/sft_rl.py's run, small: groups generated as it trains."""
    prompts = task.make_prompts(40, 0, "train")
    rollout = RolloutSettings(n=2, max_new_tokens=4)
    source = GeneratedGroups(engine, task, tok, prompts, seed=0, prompts_per_step=2, rollout=rollout,
                             filters=LoopFilters(1.0, "keep", 1))  # a random model: equal rewards are kept
    return run(backend, tok, run_dir, plan, demonstrations=sft_rows(task, tok, prompts), source=source,
               loss_fn=grpo_loss_fn(GRPOConfig(), rollout.temperature))


@pytest.mark.timeout(240)
def test_sft_then_rl_starts_from_the_newest_complete_sft_checkpoint(tmp_path):
    backend, engine, task, tok, cfg = small_run(tmp_path)
    with pytest.raises(NoSFTCheckpoint, match="none"):
        online(backend, engine, task, tok, tmp_path / "none", replace(cfg, sft=SFTConfig(steps=0)))
    report = online(backend, engine, task, tok, tmp_path / "r", PLANS["sft"])
    assert report == {"sft": {"from": 0, "to": 4}}
    assert [s for s, _ in complete_checkpoints(tmp_path / "r" / "sft")] == [4]  # the newest kept (RunPlan)
    # a later, torn SFT directory (no marker) must not be picked; nor may RL start from memory
    (tmp_path / "r" / "sft" / "step_00000010").mkdir()
    step4 = {k: v.clone() for k, v in backend.get_weights().items()}
    backend2, engine2, *_ = small_run(tmp_path)
    report = online(backend2, engine2, task, tok, tmp_path / "r", PLANS["sft+rl"])
    assert report["sft"] == {"from": 4, "to": 4}  # nothing left to do: resumed at the end
    assert report["rl_base"].endswith("step_00000004") and report["rl"] == {"from": 0, "to": 2}
    # resuming the RL phase continues after its newest complete checkpoint
    backend3, engine3, *_ = small_run(tmp_path)
    assert online(backend3, engine3, task, tok, tmp_path / "r", PLANS["rl"])["rl"] == {"from": 2, "to": 2}
    lines = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["phase"], m["step"]) for m in lines] == [("sft", 1), ("sft", 2), ("sft", 3), ("sft", 4),
                                                        ("rl", 1), ("rl", 2)]
    fresh = LocalBackend(build_model(LMModelConfig(seed=9), tok), OptimConfig(), sft_loss)
    from app.lm.train.checkpoint_dirs import load_training_checkpoint

    load_training_checkpoint(fresh, tmp_path / "r" / "sft" / "step_00000004")
    for key, value in fresh.get_weights().items():
        torch.testing.assert_close(value, step4[key])
