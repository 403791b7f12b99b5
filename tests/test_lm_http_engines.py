"""SGLang / vLLM HTTP engines and weight sync, against loopback aiohttp servers that record the
exact payloads and can fail, answer wrongly or hang."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch
from aiohttp import web

from app.lm.rollout.engine import InProcessEngine
from app.lm.rollout.http_engines import EngineError, SGLangEngine, VLLMEngine
from app.lm.causal_lm import LMModelConfig, build_model, save_model
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.rollout.weight_sync import WeightSyncError, sync_weights

pytestmark = pytest.mark.timeout(60)
EOS = 2


class FakeServer:
    """An SGLang- or vLLM-shaped server on 127.0.0.1; `mode` picks how it misbehaves."""

    def __init__(self, mode: str = "ok", gate: Gate | None = None) -> None:
        self.mode = mode
        self.gate = gate
        self.calls: list[tuple[str, str, Any]] = []
        self.version: str | None = None
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.release = asyncio.Event()   # set at stop: a hung handler then ends, so cleanup is quick

    async def start(self) -> FakeServer:
        app = web.Application()
        app.router.add_post("/update_weights_from_disk", self.sglang_update)
        app.router.add_get("/model_info", self.sglang_info)
        app.router.add_post("/generate", self.sglang_generate)
        app.router.add_post("/collective_rpc", self.vllm_rpc)
        app.router.add_post("/v1/completions", self.vllm_completions)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.release.set()
        await self.runner.cleanup()

    async def _record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, body))
        if self.mode == "hang":
            await self.release.wait()
            raise web.HTTPServiceUnavailable(text="hung until the test ended")
        if self.gate is not None:
            await self.gate.arrive()
        return body

    async def sglang_update(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.mode == "refuse":
            return web.json_response({"success": False, "message": "no such path", "num_paused_requests": 0},
                                     status=400)
        self.version = body["weight_version"] if self.mode != "stale_version" else "stale"
        return web.json_response({"success": True, "message": "ok", "num_paused_requests": 0})

    async def sglang_info(self, request: web.Request) -> web.Response:
        await self._record(request)
        return web.json_response({"model_path": "/m", "is_generation": True, "weight_version": self.version})

    async def sglang_generate(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        rows = body["input_ids"][: -1 if self.mode == "short" else None]
        return web.json_response([{"text": "", "meta_info": {
            "finish_reason": {"type": "stop"}, "weight_version": self.version or "default",
            "output_token_logprobs": [[-0.25, row[-1], None], [-0.5, EOS, None]]}} for row in rows])

    async def vllm_rpc(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.mode == "fail_reload" and body["method"] == "reload_weights":
            return web.Response(status=500, text="CUDA out of memory")
        return web.json_response({"results": [None]})

    async def vllm_completions(self, request: web.Request) -> web.Response:
        body = await self._record(request)
        if self.mode == "not_json":
            return web.Response(text="<html>gateway error</html>")
        prompt = body["prompt"]
        choices = [{"index": i, "text": "", "finish_reason": "length",
                    "logprobs": {"tokens": [f"token_id:{prompt[-1]}", f"token_id:{7 + i}"],
                                 "token_logprobs": [-1.0, -2.0]}} for i in reversed(range(body["n"]))]
        if self.mode == "one_choice":
            choices = choices[:1]
        if self.mode == "odd_finish":
            choices = [c | {"finish_reason": "eos"} for c in choices]
        return web.json_response({"choices": choices})


class Gate:
    """Answers nobody until `expected` requests have arrived: only a parallel sync gets through."""

    def __init__(self, expected: int) -> None:
        self.expected, self.arrived, self.open = expected, 0, asyncio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived >= self.expected:
            self.open.set()
        await self.open.wait()


@pytest.fixture
async def servers():
    started: list[FakeServer] = []

    async def make(mode: str = "ok", gate: Gate | None = None) -> FakeServer:
        server = await FakeServer(mode, gate).start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


async def test_sglang_sync_sends_exact_payload_then_checks_model_info(servers):
    server = await servers()
    engine = SGLangEngine("sg-a", server.url)
    await sync_weights([engine], "/ckpt/step_10", 10, timeout_s=10)
    assert server.calls == [
        ("POST", "/update_weights_from_disk",
         {"model_path": "/ckpt/step_10", "weight_version": "10", "flush_cache": True, "abort_all_requests": False}),
        ("GET", "/model_info", None)]
    assert engine.weight_version == 10


async def test_vllm_sync_points_at_new_path_then_reloads_and_tracks_version(servers):
    server = await servers()
    engine = VLLMEngine("vl-a", server.url, rpc_timeout_s=42.0)
    await sync_weights([engine], "/ckpt/step_3", 3, timeout_s=10)
    assert server.calls == [
        ("POST", "/collective_rpc", {"method": "update_config", "args": [{"model_config": {"model": "/ckpt/step_3"}}],
                                     "kwargs": {}, "timeout": 42.0}),
        ("POST", "/collective_rpc", {"method": "reload_weights", "args": [], "kwargs": {}, "timeout": 42.0})]
    assert engine.weight_version == 3


async def test_sync_runs_in_parallel_on_every_engine(servers):
    gate = Gate(expected=3)   # each server answers only once all three updates have arrived
    engines = [SGLangEngine("sg-1", (await servers(gate=gate)).url),
               VLLMEngine("vl-1", (await servers(gate=gate)).url),
               SGLangEngine("sg-2", (await servers(gate=gate)).url)]
    report = await sync_weights(engines, "/ckpt/v5", 5, timeout_s=20)
    assert sorted(report.seconds) == ["sg-1", "sg-2", "vl-1"]
    assert all(e.weight_version == 5 for e in engines)


async def test_sync_failures_name_each_engine_and_a_hung_engine_times_out(servers):
    ok = SGLangEngine("sg-ok", (await servers()).url)
    hung = SGLangEngine("sg-hung", (await servers("hang")).url)
    refused = SGLangEngine("sg-refused", (await servers("refuse")).url)
    stale = SGLangEngine("sg-stale", (await servers("stale_version")).url)
    broken = VLLMEngine("vl-broken", (await servers("fail_reload")).url)
    with pytest.raises(WeightSyncError) as caught:
        await sync_weights([ok, hung, refused, stale, broken], "/ckpt/v2", 2, timeout_s=1.0)
    err = caught.value
    assert err.synced == ["sg-ok"] and ok.weight_version == 2
    assert set(err.failures) == {"sg-hung", "sg-refused", "sg-stale", "vl-broken"}
    assert "within 1s" in err.failures["sg-hung"]
    assert "no such path" in err.failures["sg-refused"]
    assert "weight_version 'stale'" in err.failures["sg-stale"]
    assert "HTTP 500" in err.failures["vl-broken"] and "CUDA out of memory" in err.failures["vl-broken"]
    for name in err.failures:
        assert name in str(err)
    assert hung.weight_version == refused.weight_version == stale.weight_version == broken.weight_version == 0


async def test_sync_refuses_duplicate_names_and_unreachable_engine_is_named(servers):
    with pytest.raises(ValueError, match="distinct"):
        await sync_weights([SGLangEngine("x", "http://127.0.0.1:9"), VLLMEngine("x", "http://127.0.0.1:9")], "/p", 1)
    with pytest.raises(WeightSyncError, match="sg-gone"):
        await sync_weights([SGLangEngine("sg-gone", "http://127.0.0.1:9")], "/p", 1, timeout_s=5)


async def test_sync_loads_the_checkpoint_into_the_in_process_engine(servers, tmp_path):
    torch.set_num_threads(1)
    tok = build_digit_tokenizer()
    saved = build_model(LMModelConfig(seed=11), tok)
    save_model(saved, tok, tmp_path / "step_7")
    local = InProcessEngine(build_model(LMModelConfig(seed=1), tok), tok)
    remote = SGLangEngine("sg", (await servers()).url)
    await sync_weights([local, remote], tmp_path / "step_7", 7, timeout_s=30)
    assert local.weight_version == 7 == remote.weight_version
    for name, tensor in saved.state_dict().items():
        assert torch.equal(local.model.state_dict()[name], tensor)


async def test_sglang_generate_payload_and_parsing(servers):
    server = await servers()
    engine = SGLangEngine("sg", server.url)
    out = await engine.agenerate([[1, 5, 12], [1, 6, 13, 14]], n=2, max_new_tokens=9, temperature=0.7,
                                 seed=0, stop_token_ids=[8])
    method, path, body = server.calls[0]
    assert (method, path) == ("POST", "/generate")
    assert body == {"input_ids": [[1, 5, 12], [1, 5, 12], [1, 6, 13, 14], [1, 6, 13, 14]], "return_logprob": True,
                    "sampling_params": {"temperature": 0.7, "max_new_tokens": 9, "stop_token_ids": [8],
                                        "skip_special_tokens": False, "no_stop_trim": True}}
    assert [[c.tokens for c in g] for g in out] == [[[12, EOS]] * 2, [[14, EOS]] * 2]
    assert out[0][0].logprobs == [-0.25, -0.5] and out[0][0].finish_reason == "stop"
    assert out[0][0].weight_version is None   # the server's "default" version is not a number of ours
    await sync_weights([engine], "/ckpt/v6", 6, timeout_s=10)
    again = await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seed=0)
    assert again[0][0].weight_version == 6   # each completion carries the version that produced it
    wrong = SGLangEngine("sg-short", (await servers("short")).url)
    with pytest.raises(EngineError, match="sg-short.*3 completions for 4 requests"):
        await wrong.agenerate([[1, 5], [1, 6]], n=2, max_new_tokens=2, temperature=1.0, seed=0)


async def test_vllm_generate_payload_and_parsing(servers):
    server = await servers()
    engine = VLLMEngine("vl", server.url, model="tiny")
    out = await engine.agenerate([[1, 5, 12], [1, 9]], n=2, max_new_tokens=4, temperature=1.0, seed=3)
    bodies = sorted((b for _, _, b in server.calls), key=lambda b: b["seed"])
    assert bodies[0] == {"model": "tiny", "prompt": [1, 5, 12], "n": 2, "max_tokens": 4, "temperature": 1.0,
                         "seed": 3, "logprobs": 0, "return_tokens_as_token_ids": True, "stop_token_ids": [],
                         "skip_special_tokens": False, "include_stop_str_in_output": True}
    assert bodies[1]["prompt"] == [1, 9] and bodies[1]["seed"] == 4
    assert [[c.tokens for c in g] for g in out] == [[[12, 7], [12, 8]], [[9, 7], [9, 8]]]  # sorted by index
    assert out[1][1].logprobs == [-1.0, -2.0] and out[1][1].finish_reason == "length"


async def test_sync_generate_wrapper_refuses_inside_a_loop_and_works_from_a_thread(servers):
    engine = SGLangEngine("sg", (await servers()).url)
    with pytest.raises(RuntimeError, match="agenerate"):
        engine.generate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seed=0)
    out = await asyncio.to_thread(engine.generate, [[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seed=0)
    assert out[0][0].tokens == [5, EOS]


@pytest.mark.parametrize("mode,message", [("one_choice", "1 choices for n=2"), ("odd_finish", "finish_reason 'eos'"),
                                          ("not_json", "non-JSON"), ("hang", "no answer within 0.5s")])
async def test_vllm_generate_wrong_answers_and_hangs_name_the_engine(servers, mode, message):
    engine = VLLMEngine("vl-odd", (await servers(mode)).url, request_timeout_s=0.5)
    with pytest.raises(EngineError, match=f"vllm engine vl-odd: .*{message}"):
        await engine.agenerate([[1, 5]], n=2, max_new_tokens=2, temperature=1.0, seed=0)
