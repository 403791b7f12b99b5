"""One loss path: the online loop (GeneratedGroups) and the offline trainer (StoredGroups over
an exported dataset) train with the same loss (grpo_loss_fn) and the same log-prob
computation, so at T = 0.5 and T = 1.0 the importance ratio of the first GRPO step is
1 +- 1e-5 on every trained token in both, and with kl_coef > 0 both run with their reference
policy (loaded by the run from the weights GRPO starts from) and the KL term is 0 at step 0.
The check is sensitive: the same T = 0.5 rollouts scored at T = 1 are off by far more."""

from __future__ import annotations

import copy

import pytest
import torch

from app.db.rollout_store import RolloutStore
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.data_buffer import DataBuffer
from app.lm.rollout.batches import rollout_batch
from app.lm.rollout.engine import InProcessEngine
from app.lm.rollout.rollout_dataset import export_rollouts, load_rollout_dataset
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, policy_logprobs, sft_loss
from app.lm.train.reference import reference_model
from app.lm.train.rollout_sources import GeneratedGroups, StoredGroups
from app.lm.train.sft_grpo import RunPlan, run
from app.lm.truncation import RolloutSettings

pytestmark = pytest.mark.timeout(240)
TOK = build_digit_tokenizer()
TASK = DigitTask("copy", 2, 4, "partial")
PROMPTS = TASK.make_prompts(24, 3, "train")
KL = GRPOConfig(kl_coef=0.1)


def rollout(temperature: float) -> RolloutSettings:
    return RolloutSettings(n=4, max_new_tokens=5, temperature=temperature, length_is_parse_failure=False)


def policy():
    torch.set_num_threads(1)
    return build_model(LMModelConfig(seed=5), TOK)


def watched(loss_fn, temperature: float, seen: list[torch.Tensor]):
    """The run's loss, recording log p_train - log p_rollout of every trained token as it goes."""

    def fn(logits, batch):
        with torch.no_grad():
            logp = policy_logprobs(logits, batch.input_ids, temperature)
            seen.append((logp - batch.old_logprobs)[batch.loss_mask.bool()])
        return loss_fn(logits, batch)

    return fn


def first_step(model, source, temperature: float, tmp_path, scored_at: float | None = None) -> tuple[dict, torch.Tensor]:
    """One GRPO step of the one run (sft_grpo.run) with KL on and the reference it sets."""
    backend = LocalBackend(model, OptimConfig(lr=1e-3), sft_loss)
    reference = reference_model(model)
    torch.nn.init.normal_(reference.lm_head.weight)  # whatever it held: the run must reset it
    seen: list[torch.Tensor] = []
    loss = watched(grpo_loss_fn(KL, temperature, reference), scored_at or temperature, seen)
    report = run(backend, TOK, tmp_path / "run", RunPlan(None, 1e-3, 1, 1e-3, save=False), demonstrations=[],
                 source=source, loss_fn=loss, reference=reference)
    return report["final"], torch.cat(seen)


def stored_groups(model, temperature: float, tmp_path):
    """The mesh's path: self-play's batch into a rollout store, exported, loaded back."""
    engine = InProcessEngine(copy.deepcopy(model), TOK)
    with RolloutStore(tmp_path / "rollouts.db") as store:
        rollout_batch(engine, TASK, TOK, PROMPTS[:8], rollout(temperature), store, node_id="n", model_id="m", seed=1)
        export_rollouts(store, tmp_path / "dataset", window_groups=8)
    return load_rollout_dataset(tmp_path / "dataset")


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_offline_first_step_is_on_policy_and_its_kl_is_zero(temperature, tmp_path):
    model = policy()
    groups = stored_groups(model, temperature, tmp_path)
    final, log_ratio = first_step(model, StoredGroups(DataBuffer(groups, 1), groups_per_step=8), temperature,
                                  tmp_path)
    assert log_ratio.numel() == final["trained_tokens"] > 50
    assert log_ratio.abs().max().item() <= 1e-5
    assert abs(final["mean_ratio"] - 1.0) <= 1e-5
    assert 0.0 <= final["kl"] <= 1e-7  # the reference is the policy GRPO starts from


@pytest.mark.parametrize("temperature", [0.5, 1.0])
def test_online_first_step_is_on_policy_and_its_kl_is_zero(temperature, tmp_path):
    model = policy()
    engine = InProcessEngine(copy.deepcopy(model), TOK)
    torch.nn.init.normal_(engine.model.lm_head.weight)  # the loop must give the engine the trainer's weights
    source = GeneratedGroups(engine, TASK, TOK, PROMPTS, seed=2, prompts_per_step=8, rollout=rollout(temperature))
    final, log_ratio = first_step(model, source, temperature, tmp_path)
    assert log_ratio.numel() == final["trained_tokens"] > 50
    assert log_ratio.abs().max().item() <= 1e-5
    assert abs(final["mean_ratio"] - 1.0) <= 1e-5
    assert 0.0 <= final["kl"] <= 1e-7
    assert engine.weight_version == 1  # and after the step it holds the new weights, as version 1


def test_the_check_sees_a_temperature_in_the_wrong_place(tmp_path):
    model = policy()
    groups = stored_groups(model, 0.5, tmp_path)
    _, log_ratio = first_step(model, StoredGroups(DataBuffer(groups, 1), groups_per_step=8), 0.5, tmp_path,
                              scored_at=1.0)
    assert log_ratio.abs().max().item() > 1e-2


def stock_gpt2():
    """GPT-2's architecture as shipped (dropout 0.1 on embeddings, attention and residuals), tiny."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.set_num_threads(1)
    torch.manual_seed(3)
    cfg = GPT2Config(vocab_size=len(TOK), n_positions=64, n_embd=32, n_layer=2, n_head=2,
                     bos_token_id=TOK.bos_token_id, eos_token_id=TOK.eos_token_id, pad_token_id=TOK.pad_token_id)
    assert cfg.resid_pdrop == cfg.embd_pdrop == cfg.attn_pdrop == 0.1
    model = GPT2LMHeadModel(cfg)
    model.generation_config.pad_token_id = TOK.pad_token_id
    return model.train()  # as a user's code leaves it: the backend must turn dropout off itself


def test_ratio_is_one_at_step_one_with_gpt2_dropout(tmp_path):
    model = stock_gpt2()
    engine = InProcessEngine(copy.deepcopy(model), TOK)
    source = GeneratedGroups(engine, TASK, TOK, PROMPTS, seed=2, prompts_per_step=8, rollout=rollout(1.0))
    final, log_ratio = first_step(model, source, 1.0, tmp_path)
    assert log_ratio.numel() == final["trained_tokens"] > 50
    assert log_ratio.abs().max().item() <= 1e-5
    assert abs(final["mean_ratio"] - 1.0) <= 1e-5
    assert final["clip_fraction"] == 0.0
