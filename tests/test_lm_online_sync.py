"""The online loop (scripts/sft_rl.py's run: sft_grpo.run over GeneratedGroups) with an SGLang or
a vLLM engine on a loopback server with the real routes and field names (tests/engine_stubs.py
cites the upstream files): the trainer's weights reach the server after every step as a
`save_pretrained` directory, each load is confirmed by the version the server reports, every
generation request between two loads carries a seed per request and is answered with the
version just loaded; a load the server refuses (twice) stops the run before anything is
generated with weights the server did not confirm, so nothing after it is trained on."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.rollout.engine import EngineOutOfService
from app.lm.rollout.groups import DROP_REASONS
from app.lm.rollout.sglang_engine import SGLangEngine
from app.lm.rollout.vllm_engine import VLLMEngine
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.grpo import GRPOConfig, grpo_loss_fn, sft_loss
from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
from app.lm.train.sft_grpo import RunPlan, run
from app.lm.train.weight_publish import WeightPublisher
from app.lm.truncation import RolloutSettings
from tests.engine_stubs import SGLangStub, VLLMStub

pytestmark = pytest.mark.timeout(180)
TOK = build_digit_tokenizer()
TASK = DigitTask("copy", 2, 3, "partial")
PROMPTS = TASK.make_prompts(16, 4, "train")
ROLLOUT = RolloutSettings(n=2, max_new_tokens=4, temperature=1.0, length_is_parse_failure=False)
STEPS = 3


def online_run(engine, run_dir: Path) -> dict:
    """The online run of scripts/sft_rl.py, GRPO only, `STEPS` steps, weights synced from disk."""
    torch.set_num_threads(1)
    model = build_model(LMModelConfig(seed=3), TOK)
    backend = LocalBackend(model, OptimConfig(lr=1e-3), sft_loss)
    publish = WeightPublisher(backend.get_weights, model=backend.model, tokenizer=TOK,
                              out_dir=run_dir / "engine_weights")
    source = GeneratedGroups(engine, TASK, TOK, PROMPTS, seed=9, prompts_per_step=2, rollout=ROLLOUT,
                             publish=publish, filters=LoopFilters(1.0, "keep", 1))  # no filter: counts exact
    return run(backend, TOK, run_dir, RunPlan(None, 1e-3, STEPS, 1e-3, save=False), demonstrations=[],
               source=source, loss_fn=grpo_loss_fn(GRPOConfig(), ROLLOUT.temperature, None))


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def loads_and_generations(server, load_path: str, gen_path: str) -> list[tuple[str, object]]:
    return [(path, body) for _, path, _, body in server.calls if path in (load_path, gen_path)]


async def run_against(server, kind: str, run_dir: Path, built: list | None = None):
    """Start `server`, run the online loop against it (in a thread: the loop blocks), stop it;
    the engine is returned, and appended to `built` (for a run that raises)."""
    await server.start()
    try:
        engine = (SGLangEngine if kind == "sglang" else VLLMEngine)(kind, server.url, sync_timeout_s=30.0)
        (built if built is not None else []).append(engine)
        await asyncio.to_thread(online_run, engine, run_dir)
        return engine
    finally:
        await server.stop()


async def test_sglang_gets_every_steps_weights_and_serves_each_step_with_them(tmp_path):
    server = SGLangStub()
    engine = await run_against(server, "sglang", tmp_path / "run")
    loads = server.bodies("/update_weights_from_disk")
    # the weights GRPO starts from (version 0), then the trainer's after every step
    assert [(b["model_path"], b["weight_version"]) for b in loads] == [
        (str(tmp_path / "run" / "engine_weights" / f"step_{v}"), str(v)) for v in range(STEPS + 1)]
    assert all(b["flush_cache"] is True and b["abort_all_requests"] is False for b in loads)
    assert all(set(b) == {"model_path", "weight_version", "flush_cache", "abort_all_requests"} for b in loads)
    # each load is read back (/model_info) before anything is generated with it
    order = [p for p in server.paths() if p in ("/update_weights_from_disk", "/model_info", "/generate")]
    for i, path in enumerate(order):
        if path == "/update_weights_from_disk":
            assert order[i + 1] == "/model_info"
    # between load v and load v+1 the server is asked for step v+1's rollouts, one seed per request
    version, seen = None, {}
    for path, body in loads_and_generations(server, "/update_weights_from_disk", "/generate"):
        if path == "/update_weights_from_disk":
            version = body["weight_version"]
            continue
        seeds = [p["sampling_seed"] for p in body["sampling_params"]]
        assert len(seeds) == len(body["input_ids"]) and len(set(seeds)) == len(seeds)
        seen.setdefault(version, []).extend(seeds)
    assert sorted(seen) == [str(v) for v in range(STEPS)]
    lines = metrics(tmp_path / "run")
    # step k trains on the rollouts of the weights the server confirmed as version k - 1
    assert [line["weight_version"] for line in lines if "weight_version" in line] == list(range(STEPS))
    # and says how many groups the rollout manager dropped, by reason (none of these is on here)
    assert all(line[f"dropped_{reason}"] == 0 for line in lines for reason in DROP_REASONS)
    assert engine.weight_version == STEPS and engine.in_service


async def test_vllm_gets_every_steps_weights_with_its_prefix_cache_reset_each_time(tmp_path):
    server = VLLMStub()
    engine = await run_against(server, "vllm", tmp_path / "run")
    versions = [b["new_version"] for b in server.bodies("/update_weight_version")]
    assert versions == [str(v) for v in range(STEPS + 1)]
    configs = [b["args"][0]["model_config"]["model"] for b in server.bodies("/collective_rpc")
               if b["method"] == "update_config"]
    assert configs == [str(tmp_path / "run" / "engine_weights" / f"step_{v}") for v in range(STEPS + 1)]
    assert server.paths().count("/reset_prefix_cache") == STEPS + 1
    assert server.stale_hits == 0  # no generation found KV blocks computed with older weights
    completions = server.bodies("/v1/completions")
    # one request per completion (the rollout manager asks for exactly the samples it lacks), each its own seed
    assert len(completions) == STEPS * 2 * ROLLOUT.n and all(b["n"] == 1 for b in completions)
    assert len({b["seed"] for b in completions}) == len(completions)
    assert engine.weight_version == STEPS and engine.in_service and not server.paused


class RefusesFrom(SGLangStub):
    """Loads versions below `version`; from `version` on it refuses the load (as SGLang does a bad path)."""

    def __init__(self, version: int) -> None:
        super().__init__()
        self.refuse_from = version

    async def record(self, request):
        body = await super().record(request)
        if request.path == "/update_weights_from_disk" and int(body["weight_version"]) >= self.refuse_from:
            self.fail.add(request.path)
        return body


async def test_a_refused_load_stops_the_run_and_nothing_after_it_is_generated_or_trained(tmp_path):
    server, built = RefusesFrom(2), []
    with pytest.raises(EngineOutOfService, match="sglang.*no such path"):
        await run_against(server, "sglang", tmp_path / "run", built)
    (engine,) = built
    order = [(p, b) for p, b in loads_and_generations(server, "/update_weights_from_disk", "/generate")]
    first_refused = next(i for i, (p, b) in enumerate(order) if p == "/update_weights_from_disk"
                         and b["weight_version"] == "2")
    after = [p for p, _ in order[first_refused:]]
    assert "/generate" not in after  # nothing generated once the server failed to confirm version 2
    assert after == ["/update_weights_from_disk", "/update_weights_from_disk"]  # the step's sync and one retry
    trained = [line for line in metrics(tmp_path / "run") if "weight_version" in line]
    assert [line["weight_version"] for line in trained] == [0, 1]  # steps 1 and 2; step 3 never ran
    assert not engine.in_service and engine.weight_version == 1 and "no such path" in engine.last_error


async def test_sft_rl_cli_runs_its_online_loop_against_a_server_with_the_flags_it_takes(tmp_path):
    """scripts/sft_rl.py as a user runs it: --engine sglang --engine-url ... --sync-timeout,
    KL on, zero-variance groups dropped, rewards in a worker: every flag acts."""
    import sys

    server = await SGLangStub().start()
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "scripts/sft_rl.py", "--run-dir", str(tmp_path / "run"), "--mode", "rl", "--rl-steps", "2",
            "--prompts-per-step", "2", "--group-size", "4", "--engine", "sglang", "--engine-url", server.url,
            "--sync-timeout", "30", "--kl-coef", "0.1", "--zero-variance", "drop", "--oversample", "2",
            "--reward-workers", "1", "--reward-timeout", "5", "--reward", "partial",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 150)
    finally:
        await server.stop()
    assert proc.returncode == 0, err.decode()[-3000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    assert set(report["dropped_groups"]) <= set(DROP_REASONS)
    loads = server.bodies("/update_weights_from_disk")
    assert [b["weight_version"] for b in loads] == ["0", "1", "2"]
    assert all(b["model_path"].startswith(str(tmp_path / "run" / "engine_weights")) for b in loads)
    lines = metrics(tmp_path / "run")
    rl = [line for line in lines if line.get("phase") == "rl"]
    assert len(rl) == 2 and rl[0]["kl"] <= 1e-7 and "dropped_zero_variance" in rl[0]
