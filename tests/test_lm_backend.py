"""LM training backends under real torchrun on CPU (gloo): FSDP2 equals one process, DCP
checkpoints of 2 ranks resume at 1, 2 and 3 ranks, full state -> save_pretrained ->
from_pretrained gives the same logits. The 1-rank reference is LocalBackend in this process,
so "FSDP2 on W ranks" is compared with a plain unsharded module, not with itself.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.tokenizer import build_digit_tokenizer
from app.shared.launcher import LaunchSpec, launch
from app.lm.train.backend import LocalBackend, TrainingBackend, done, wait
from app.lm.train.checkpoint_dirs import (
    COMPLETE,
    LATEST,
    load_training_checkpoint,
    newest_complete,
)
from app.lm.train.hf_io import SAFE_INDEX, load_full_state, load_weight_files
from tests import lm_backend_job as job

STEPS, SAVE_AT = 5, 3
JOB = str(Path(job.__file__).resolve())


def run_job(tmp: Path, name: str, nproc: int, *args: str) -> dict[int, list[float]]:
    out = tmp / f"{name}.json"
    launch(LaunchSpec(target=[JOB, "--out", str(out), *args], nproc=nproc, log_dir=tmp / f"logs-{name}",
                      timeout_s=200, status_every_s=0), out=io.StringIO())
    return {int(k): v for k, v in json.loads(out.read_text()).items()}


def local_backend() -> LocalBackend:
    return LocalBackend(build_model(LMModelConfig(seed=5), build_digit_tokenizer()), job.OPTIM, job.loss_fn)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp")
    losses = run_job(tmp, "A", 2, "--steps", str(STEPS), "--save-at", str(SAVE_AT), "--ckpt-root", str(tmp / "ckpt"),
                     "--hf-dir", str(tmp / "export" / "hf"), "--logits", str(tmp / "logits.pt"),
                     "--dropout-probe", str(tmp / "dropout.json"))
    return {"tmp": tmp, "losses": losses}


@pytest.mark.timeout(300)
def test_fsdp_backend_forwards_with_dropout_off(two_ranks):
    """Each rank's GRPO forward on a stock GPT-2 (dropout 0.1) is deterministic and equals the
    eval-mode forward: the ratio's log-probs are the sampler's in the sharded backend too."""
    probe = json.loads((two_ranks["tmp"] / "dropout.json").read_text())
    first, second, evaluated = probe["losses"]
    assert first == second == pytest.approx(evaluated, abs=1e-7)
    assert probe["training"] is False


@pytest.mark.timeout(300)
def test_fsdp_two_ranks_give_the_losses_of_one_process(two_ranks):
    backend = local_backend()
    assert isinstance(backend, TrainingBackend)
    pad = build_digit_tokenizer().pad_token_id
    local = {s: job.run_step(backend, s, pad) for s in range(1, STEPS + 1)}
    fsdp = two_ranks["losses"]
    assert sorted(fsdp) == list(range(1, STEPS + 1))
    for step in local:
        assert fsdp[step][0] == pytest.approx(local[step][0], rel=1e-5, abs=1e-7), f"loss of step {step}"
        assert fsdp[step][1] == pytest.approx(local[step][1], rel=1e-5), f"grad norm of step {step}"
    assert max(n for _, n in local.values()) > job.OPTIM.max_grad_norm  # clipping was exercised
    assert len({round(v[0], 6) for v in local.values()}) == STEPS  # the steps really differ


@pytest.mark.timeout(400)
def test_dcp_checkpoint_of_two_ranks_resumes_at_one_two_and_three(two_ranks):
    tmp, losses = two_ranks["tmp"], two_ranks["losses"]
    found = newest_complete(tmp / "ckpt")
    assert found is not None and found[0] == SAVE_AT and (found[1] / COMPLETE).is_file()
    assert (tmp / "ckpt" / LATEST).read_text() == found[1].name
    assert not [p for p in (tmp / "ckpt").iterdir() if p.name.startswith(".")]  # no staging left behind
    backend = local_backend()  # 1 rank: a plain module reads the 2-rank shards
    state = load_training_checkpoint(backend, found[1])
    assert state["step"] == SAVE_AT and state["phase"] == "test"
    pad = build_digit_tokenizer().pad_token_id
    assert job.run_step(backend, SAVE_AT + 1, pad)[0] == pytest.approx(losses[SAVE_AT + 1][0], rel=1e-5, abs=1e-7)
    for nproc in (2, 3):
        resumed = run_job(tmp, f"R{nproc}", nproc, "--steps", str(SAVE_AT + 1), "--resume", str(found[1]))
        assert list(resumed) == [SAVE_AT + 1]
        assert resumed[SAVE_AT + 1][0] == pytest.approx(losses[SAVE_AT + 1][0], rel=1e-5, abs=1e-7), f"{nproc} ranks"


@pytest.mark.timeout(300)
def test_full_state_then_save_pretrained_gives_the_same_logits_after_from_pretrained(two_ranks):
    from transformers import LlamaForCausalLM

    tmp = two_ranks["tmp"]
    hf_dir = tmp / "export" / "hf"
    index = json.loads((hf_dir / SAFE_INDEX).read_text())
    assert len(set(index["weight_map"].values())) >= 2  # 100KB shards of a ~300KB model
    assert (hf_dir / "tokenizer.json").is_file() and (hf_dir / COMPLETE).is_file()
    model = LlamaForCausalLM.from_pretrained(str(hf_dir), local_files_only=True).eval()
    batch = job.probe_batch(build_digit_tokenizer().pad_token_id)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    expected = torch.load(tmp / "logits.pt")
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)
    # The whole-state file holds every tensor of the model and Adam's moments for every parameter.
    full = load_full_state(tmp / "export" / "full_state.pt")
    weights = load_weight_files(hf_dir)
    assert set(weights) <= set(full["model"]) and len(weights) >= 20  # lm_head.weight is tied: not in the file
    for key, value in weights.items():
        torch.testing.assert_close(full["model"][key], value)
    n_params = len(list(model.parameters()))
    assert len(full["optim"]["state"]) == n_params
    assert all(v["exp_avg"].shape == full["model"][k].shape for k, v in full["optim"]["state"].items())


def test_forward_backward_accumulates_until_optim_step():
    from app.lm.train.batching import collate

    pad = build_digit_tokenizer().pad_token_id
    rows = job.global_rows(1)
    normalizer = sum(r.trained_tokens for r in rows)
    split, whole = local_backend(), local_backend()
    wait(split.forward_backward(collate(rows[:6], pad, normalizer)))
    first = {n: p.grad.clone() for n, p in split.model.named_parameters()}
    wait(split.forward_backward(collate(rows[6:], pad, normalizer)))
    wait(whole.forward_backward(collate(rows, pad, normalizer)))
    grads = dict(whole.model.named_parameters())
    for name, p in split.model.named_parameters():
        assert not torch.equal(first[name], p.grad)  # the second micro-batch added to the first
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-7)
    stats = wait(split.optim_step())
    assert stats["rows"] == len(rows) and stats["tokens"] == normalizer
    assert all(p.grad is None for p in split.model.parameters())
    assert done(3).result(timeout=0) == 3
