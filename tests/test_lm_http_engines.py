"""SGLang / vLLM engines and the weight sync, against loopback servers with the real routes and
field names (tests/engine_stubs.py cites the upstream files): every payload checked field by
field, the version a rollout carries is the one the server reported after the load, a failed
or timed-out load leaves the server's config as it was and the engine out of service, the
vLLM prefix cache is reset around every load, the configured sync timeout is the one used,
a server restarted with its old weights is caught, and a vLLM server in the wrong log-prob
mode is refused at start-up."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from app.lm.causal_lm import LMModelConfig, build_model, save_model
from app.lm.rollout.engine import EngineError, EngineOutOfService, InProcessEngine, WeightUpdate
from app.lm.rollout.sglang_engine import SGLangEngine
from app.lm.rollout.vllm_engine import VLLMEngine
from app.lm.rollout.weight_sync import WeightSyncError, start_engines, sync_engines
from app.lm.tokenizer import build_digit_tokenizer
from tests.engine_stubs import EOS, SGLangStub, VLLMStub, decode_sglang_tensors, sample_tokens

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def stubs():
    started = []

    async def make(kind: str = "sglang", **kw):
        server = await (SGLangStub(**kw) if kind == "sglang" else VLLMStub(**kw)).start()
        started.append(server)
        return server

    yield make
    for server in started:
        await server.stop()


async def assert_caught_after_restart(engine, server, match: str) -> None:
    """`server` restarted with its old weights: the engine's next generation is refused and
    takes it out of service, and the one after is refused without asking the server."""
    server.restart()
    with pytest.raises(EngineOutOfService, match=match):
        await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    assert not engine.in_service
    calls = len(server.calls)
    with pytest.raises(EngineOutOfService):
        await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    assert len(server.calls) == calls


def weights() -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.arange(6.0).reshape(3, 2), "lm_head.bias": torch.tensor([0.5, -1.0])}


async def test_sglang_disk_load_payload_field_by_field_then_the_version_read_back(stubs):
    server = await stubs()
    engine = SGLangEngine("sg", server.url)
    assert not engine.in_service  # the server's weights are unknown until this node loads some
    await sync_engines([engine], WeightUpdate(10, path="/ckpt/step_10"))
    assert server.calls == [
        ("POST", "/update_weights_from_disk", {}, {"model_path": "/ckpt/step_10", "weight_version": "10",
                                                  "flush_cache": True, "abort_all_requests": False}),
        ("GET", "/model_info", {}, None)]
    assert engine.weight_version == 10 and engine.in_service and engine.last_error is None


async def test_sglang_tensor_load_sends_the_weights_in_sglangs_serializer_format(stubs):
    server = await stubs()
    engine = SGLangEngine("sg", server.url, sync_mode="tensor", tp_size=2)
    await sync_engines([engine], WeightUpdate(4, tensors=weights))
    (method, path, _, body), info = server.calls
    assert (method, path, info[1]) == ("POST", "/update_weights_from_tensor", "/model_info")
    assert set(body) == {"serialized_named_tensors", "load_format", "flush_cache", "abort_all_requests",
                         "weight_version"}
    assert (body["load_format"], body["flush_cache"], body["abort_all_requests"], body["weight_version"]) == \
        (None, True, False, "4")
    assert len(body["serialized_named_tensors"]) == 2  # one per tensor-parallel rank
    assert set(server.tensors) == set(weights())
    for name, tensor in weights().items():
        assert torch.equal(server.tensors[name], tensor)
    assert engine.weight_version == 4


async def test_sglang_generate_carries_a_seed_per_request_and_a_restart_takes_it_out_of_service(stubs):
    server = await stubs()
    engine = SGLangEngine("sg", server.url)
    await sync_engines([engine], WeightUpdate(6, path="/ckpt/v6"))
    out = await engine.agenerate([[1, 5, 12], [1, 6, 13, 14]], n=2, max_new_tokens=9, temperature=0.7,
                                 seeds=[100, 200], stop_token_ids=[8])
    _, path, _, body = server.calls[-1]
    assert path == "/generate"
    assert body["input_ids"] == [[1, 5, 12], [1, 5, 12], [1, 6, 13, 14], [1, 6, 13, 14]]
    assert body["return_logprob"] is True
    assert body["sampling_params"] == [
        {"temperature": 0.7, "max_new_tokens": 9, "stop_token_ids": [8], "skip_special_tokens": False,
         "no_stop_trim": True, "sampling_seed": seed} for seed in (100, 101, 200, 201)]
    assert [c.tokens for c in out[1]] == [sample_tokens(200, 2), sample_tokens(201, 2)]
    assert all(c.weight_version == 6 and c.logprobs == [-0.5, -0.5] for g in out for c in g)

    # back with the weights it was started with: it says "default", not 6
    await assert_caught_after_restart(engine, server, "weight_version 'default'.*restarted")
    await sync_engines([engine], WeightUpdate(6, path="/ckpt/v6"))  # a successful sync brings it back
    assert engine.in_service and (await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0,
                                                         seeds=[0]))[0][0].weight_version == 6


async def test_vllm_start_refuses_a_server_in_raw_logprobs_mode_and_one_without_dev_mode(stubs):
    raw = VLLMEngine("vl-raw", (await stubs("vllm", logprobs_mode="raw_logprobs")).url)
    with pytest.raises(EngineError, match="mode 'raw_logprobs'.*--logprobs-mode processed_logprobs"):
        await raw.start()
    hidden = VLLMEngine("vl-nodev", (await stubs("vllm", dev_mode=False)).url)
    with pytest.raises(EngineError, match="/server_info is not served.*--logprobs-mode processed_logprobs.*"
                                          "VLLM_SERVER_DEV_MODE=1"):
        await hidden.start()
    good = await stubs("vllm")
    engine = VLLMEngine("vl", good.url)
    await engine.start()
    assert ("GET", "/server_info", {"config_format": "json"}, None) in good.calls
    assert engine.model_path == "/served/at/start" and engine.reports_version


async def test_vllm_disk_load_pauses_points_reloads_resets_the_cache_confirms_and_resumes(stubs):
    server = await stubs("vllm")
    engine = VLLMEngine("vl", server.url, rpc_timeout_s=42.0)
    await engine.start()
    server.cache[(1, 5)] = server.loaded  # KV blocks computed with the weights of the start
    server.calls.clear()
    await sync_engines([engine], WeightUpdate(3, path="/ckpt/step_3"))
    assert server.calls == [
        ("POST", "/pause", {"mode": "abort"}, None),
        ("POST", "/collective_rpc", {}, {"method": "update_config", "args": [{"model_config": {"model": "/ckpt/step_3"}}],
                                         "kwargs": {}, "timeout": 42.0}),
        ("POST", "/collective_rpc", {}, {"method": "reload_weights", "args": [], "kwargs": {}, "timeout": 42.0}),
        ("POST", "/reset_prefix_cache", {}, None),
        ("POST", "/update_weight_version", {}, {"new_version": "3"}),
        ("GET", "/weight_info", {}, None),
        ("POST", "/resume", {}, None)]
    assert server.loaded == "/ckpt/step_3" and not server.cache and not server.paused
    assert engine.weight_version == 3 and engine.in_service and engine.model_path == "/ckpt/step_3"
    out = await engine.agenerate([[1, 5], [1, 9]], n=2, max_new_tokens=4, temperature=1.0, seeds=[7, 70])
    bodies = server.bodies("/v1/completions")
    assert bodies[0] == {"model": "default", "prompt": [1, 5], "n": 2, "max_tokens": 4, "temperature": 1.0,
                         "seed": 7, "logprobs": 0, "return_tokens_as_token_ids": True, "stop_token_ids": [],
                         "skip_special_tokens": False, "include_stop_str_in_output": True}
    assert bodies[1]["prompt"] == [1, 9] and bodies[1]["seed"] == 70
    assert [c.tokens for c in out[1]] == [sample_tokens(70, 2), sample_tokens(71, 2)]  # children: seed + index
    assert server.stale_hits == 0 and all(c.weight_version == 3 for g in out for c in g)


async def test_vllm_failed_reload_undoes_update_config_and_leaves_the_engine_out_of_service(stubs):
    server = await stubs("vllm")
    engine = VLLMEngine("vl", server.url)
    await engine.start()
    await sync_engines([engine], WeightUpdate(1, path="/ckpt/step_1"))
    server.fail_rpc.add("reload_weights")
    with pytest.raises(WeightSyncError, match="vl.*HTTP 500.*CUDA out of memory"):
        await sync_engines([engine], WeightUpdate(2, path="/ckpt/step_2"))
    updates = [b["args"] for b in server.bodies("/collective_rpc") if b["method"] == "update_config"]
    assert updates[-2:] == [[{"model_config": {"model": "/ckpt/step_2"}}], [{"model_config": {"model": "/ckpt/step_1"}}]]
    assert server.config_model == "/ckpt/step_1" == server.loaded  # the config as it was
    assert server.paths()[-1] == "/resume" and not server.paused
    assert not engine.in_service and engine.weight_version == 1 and "CUDA out of memory" in engine.last_error
    with pytest.raises(EngineOutOfService):
        await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    server.fail_rpc.clear()
    await sync_engines([engine], WeightUpdate(2, path="/ckpt/step_2"))
    assert engine.in_service and engine.weight_version == 2 and server.loaded == "/ckpt/step_2"


async def test_an_older_vllm_without_pause_or_versions_still_gets_its_prefix_cache_reset(stubs):
    server = await stubs("vllm", old=True)
    engine = VLLMEngine("vl-old", server.url)
    await engine.start()
    assert not engine.reports_version
    server.calls.clear()
    await sync_engines([engine], WeightUpdate(5, path="/ckpt/step_5"))
    assert server.paths() == ["/pause", "/collective_rpc", "/collective_rpc", "/reset_prefix_cache"]
    assert not engine.native_pause and engine.weight_version == 5
    await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    server.calls.clear()
    await sync_engines([engine], WeightUpdate(6, path="/ckpt/step_6"))  # no second /pause attempt
    assert server.paths() == ["/collective_rpc", "/collective_rpc", "/reset_prefix_cache"]
    await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    assert server.stale_hits == 0  # the prompt's blocks of step 5 were gone before step 6 served it


class RecordingSender:
    """The trainer's side of vLLM's NCCL transfer (vLLM's own NCCLWeightTransferEngine in
    production, which needs vllm and a GPU): records what it would broadcast."""

    def __init__(self) -> None:
        self.init_args: tuple | None = None
        self.sent: list[list[tuple[str, torch.Tensor]]] = []

    def init(self, master_address: str, master_port: int, world_size: int) -> None:
        self.init_args = (master_address, master_port, world_size)

    def send(self, named) -> None:
        self.sent.append(list(named))


async def test_vllm_tensor_load_uses_the_weight_transfer_routes(stubs):
    server = await stubs("vllm", world_size=2)
    sender = RecordingSender()
    engine = VLLMEngine("vl-t", server.url, sync_mode="tensor", nccl_master="10.0.0.5:29555", sender=sender)
    await engine.start()
    assert server.bodies("/init_weight_transfer_engine") == [
        {"init_info": {"master_address": "10.0.0.5", "master_port": 29555, "rank_offset": 1, "world_size": 3}}]
    assert ("GET", "/get_world_size", {"include_dp": "true"}, None) in server.calls
    assert sender.init_args == ("10.0.0.5", 29555, 3)
    server.calls.clear()
    await sync_engines([engine], WeightUpdate(8, tensors=weights))
    assert server.paths() == ["/pause", "/start_weight_update", "/update_weights", "/finish_weight_update",
                              "/reset_prefix_cache", "/weight_info", "/resume"]
    assert server.bodies("/update_weights") == [{"update_info": {
        "names": ["model.embed_tokens.weight", "lm_head.bias"], "dtype_names": ["float32", "float32"],
        "shapes": [[3, 2], [2]], "packed": False}}]
    assert server.bodies("/finish_weight_update") == [{"weight_version": "8"}]
    assert [name for name, _ in sender.sent[0]] == ["model.embed_tokens.weight", "lm_head.bias"]
    assert engine.weight_version == 8 and engine.in_service
    with pytest.raises(EngineError, match="nccl_master"):
        await VLLMEngine("vl-bad", server.url, sync_mode="tensor", sender=sender).start()


async def test_the_configured_sync_timeout_is_the_one_used_and_a_hung_server_costs_only_its_own(stubs):
    hung = await stubs()
    hung.hang.add("/update_weights_from_disk")
    slow = await stubs()
    slow.delay["/update_weights_from_disk"] = 1.0
    fine = await stubs("vllm")
    hung_e = SGLangEngine("sg-hung", hung.url, sync_timeout_s=0.5)
    slow_e = SGLangEngine("sg-slow", slow.url, sync_timeout_s=10.0, request_timeout_s=0.2)  # generation's: short
    vllm_e = VLLMEngine("vl", fine.url, sync_timeout_s=10.0)
    await start_engines([hung_e, slow_e, vllm_e])
    started = time.monotonic()
    with pytest.raises(WeightSyncError) as caught:
        await sync_engines([hung_e, slow_e, vllm_e], WeightUpdate(2, path="/ckpt/v2"))
    assert time.monotonic() - started < 8.0
    err = caught.value
    assert sorted(err.synced) == ["sg-slow", "vl"] and set(err.failures) == {"sg-hung"}
    assert "0.5" in err.failures["sg-hung"] and "sg-hung" in str(err)
    assert not hung_e.in_service and slow_e.in_service and slow_e.weight_version == 2


async def test_a_refused_or_mislabelled_load_fails_naming_the_engine(stubs):
    refused = await stubs()
    refused.fail.add("/update_weights_from_disk")
    engine = SGLangEngine("sg-refused", refused.url)
    with pytest.raises(WeightSyncError, match="sg-refused.*no such path"):
        await sync_engines([engine], WeightUpdate(2, path="/nope"))
    assert not engine.in_service and "no such path" in engine.last_error
    with pytest.raises(ValueError, match="distinct"):
        await sync_engines([SGLangEngine("x", refused.url), SGLangEngine("x", refused.url)], WeightUpdate(1, path="/p"))
    gone = SGLangEngine("sg-gone", "http://127.0.0.1:9")
    with pytest.raises(WeightSyncError, match="sg-gone"):
        await sync_engines([gone], WeightUpdate(1, path="/p"))


async def test_sync_loads_the_checkpoint_into_the_in_process_engine_beside_a_server(stubs, tmp_path):
    torch.set_num_threads(1)
    tok = build_digit_tokenizer()
    saved = build_model(LMModelConfig(seed=11), tok)
    save_model(saved, tok, tmp_path / "step_7")
    local = InProcessEngine(build_model(LMModelConfig(seed=1), tok), tok, sync_mode="disk")
    remote = SGLangEngine("sg", (await stubs()).url)
    await sync_engines([local, remote], WeightUpdate(7, path=tmp_path / "step_7"))
    assert local.weight_version == 7 == remote.weight_version
    for name, tensor in saved.state_dict().items():
        assert torch.equal(local.model.state_dict()[name], tensor)


async def test_the_sync_generate_face_refuses_inside_a_loop_and_works_from_a_thread(stubs):
    engine = SGLangEngine("sg", (await stubs()).url)
    await sync_engines([engine], WeightUpdate(1, path="/p"))
    with pytest.raises(RuntimeError, match="agenerate"):
        engine.generate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    out = await asyncio.to_thread(engine.generate, [[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[3])
    assert out[0][0].tokens == sample_tokens(3, 2) and out[0][0].tokens[-1] == EOS


@pytest.mark.parametrize("fault,message", [("short", "1 choices for n=2"), ("hang", "no answer within 0.5s")])
async def test_vllm_generate_wrong_answers_and_hangs_name_the_engine(stubs, fault, message):
    server = await stubs("vllm")
    engine = VLLMEngine("vl-odd", server.url, request_timeout_s=0.5)
    await engine.start()
    await sync_engines([engine], WeightUpdate(1, path="/p"))
    if fault == "hang":
        server.hang.add("/v1/completions")
        with pytest.raises(EngineError, match=f"vllm engine vl-odd: .*{message}"):
            await engine.agenerate([[1, 5]], n=2, max_new_tokens=2, temperature=1.0, seeds=[0])
        return
    server.short = True
    with pytest.raises(EngineError, match=f"vllm engine vl-odd: .*{message}"):
        await engine.agenerate([[1, 5]], n=2, max_new_tokens=2, temperature=1.0, seeds=[0])


async def test_a_vllm_server_restarted_with_its_old_weights_is_caught_and_synced_back(stubs):
    server = await stubs("vllm")
    engine = VLLMEngine("vl", server.url)
    await engine.start()
    await sync_engines([engine], WeightUpdate(4, path="/ckpt/step_4"))
    await assert_caught_after_restart(engine, server, "vl.*'default'")  # /weight_info says "default"
    await sync_engines([engine], WeightUpdate(4, path="/ckpt/step_4"))
    assert engine.in_service and server.loaded == "/ckpt/step_4"
    out = await engine.agenerate([[1, 5]], n=1, max_new_tokens=2, temperature=1.0, seeds=[0])
    assert out[0][0].weight_version == 4
