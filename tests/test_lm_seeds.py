"""Reproducible sampling: every engine request carries a seed derived from (the draw's seed,
prompt id, sample index, step) (agent.request_seed), sent as SGLang's `sampling_seed` and vLLM's
`seed`, so a completion can be redone alone: the in-process engine gives the very same tokens
and log-probs for a (prompt, sample) whatever else shares its batch."""

from __future__ import annotations

import asyncio

import pytest
import torch

from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.rollout.agent import request_seed, run_episodes
from app.lm.rollout.engine import InProcessEngine, WeightUpdate
from app.lm.rollout.sglang_engine import SGLangEngine
from app.lm.rollout.vllm_engine import VLLMEngine
from app.lm.rollout.weight_sync import sync_engines
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.truncation import RolloutSettings
from tests.engine_stubs import SGLangStub, VLLMStub

pytestmark = pytest.mark.timeout(60)
TOK = build_digit_tokenizer()
TASK = DigitTask("copy", 3, 3, "partial")
PROMPTS = TASK.make_prompts(6, 2, "train")
SETTINGS = RolloutSettings(n=4, max_new_tokens=5, temperature=1.0, length_is_parse_failure=False)


def test_a_completion_is_redone_alone_with_the_same_tokens():
    torch.set_num_threads(1)
    engine = InProcessEngine(build_model(LMModelConfig(seed=4), TOK), TOK)
    batch = run_episodes(engine, TASK, TOK, [(p, i) for p in PROMPTS for i in range(4)], SETTINGS, seed=11)
    target = next(s for s in batch if s.prompt_id == PROMPTS[3].prompt_id and s.group_index == 2)
    (alone,) = run_episodes(engine, TASK, TOK, [(PROMPTS[3], 2)], SETTINGS, seed=11)
    assert alone.response_tokens == target.response_tokens
    assert alone.rollout_logprobs == pytest.approx(target.rollout_logprobs, abs=1e-5)
    redraws = [run_episodes(engine, TASK, TOK, [(PROMPTS[3], 2)], SETTINGS, seed=s)[0].response_tokens
               for s in range(12, 20)]
    assert any(r != target.response_tokens for r in redraws)  # the seed does choose the draw


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
async def test_each_request_carries_its_derived_seed(kind):
    server = await (SGLangStub() if kind == "sglang" else VLLMStub()).start()
    try:
        engine = SGLangEngine("sg", server.url) if kind == "sglang" else VLLMEngine("vl", server.url)
        await engine.start()
        await sync_engines([engine], WeightUpdate(1, path="/ckpt/1"))
        requests = [(p, i) for p in PROMPTS[:3] for i in range(2)]
        await asyncio.to_thread(run_episodes, engine, TASK, TOK, requests, SETTINGS, seed=7)
    finally:
        await server.stop()
    expected = sorted(request_seed(7, p.prompt_id, i, 0) for p, i in requests)
    if kind == "sglang":
        sent = [sp["sampling_seed"] for b in server.bodies("/generate") for sp in b["sampling_params"]]
    else:
        sent = [b["seed"] for b in server.bodies("/v1/completions")]
    assert sorted(sent) == expected and len(set(expected)) == len(expected)
