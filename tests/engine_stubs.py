"""Loopback SGLang and vLLM servers for the engine tests: the real routes with their real field
names, state the way the servers keep it, every call recorded, and the faults to test.

Names checked against the upstream sources (read with the search tool, 2026-11-27):

SGLang (github.com/sgl-project/sglang)
  python/sglang/srt/entrypoints/http_server.py  POST /generate, POST /update_weights_from_disk
      (answers {success, message, num_paused_requests}, HTTP 400 when not successful),
      POST /update_weights_from_tensor ({success, message}), GET /model_info (newer name of
      /get_model_info: {model_path, tokenizer_path, is_generation, ..., weight_version})
  python/sglang/srt/managers/io_struct.py  UpdateWeightFromDiskReqInput {model_path, load_format,
      abort_all_requests, weight_version, ... flush_cache}; UpdateWeightsFromTensorReqInput
      {serialized_named_tensors (one entry per TP rank), load_format, flush_cache,
      abort_all_requests, weight_version}; GenerateReqInput {input_ids, sampling_params (a dict
      or one per input), return_logprob}; meta_info {finish_reason: {type}, weight_version,
      output_token_logprobs: [[logprob, token_id, text]]}
  python/sglang/srt/sampling/sampling_params.py  SamplingParams(..., sampling_seed)
  MultiprocessingSerializer (python/sglang/srt/utils): ForkingPickler dump, base64 for HTTP
vLLM (github.com/vllm-project/vllm)
  vllm/entrypoints/serve/rpc/api_router.py  POST /collective_rpc {method, args, kwargs, timeout}
      -> {"results": [one per worker]} (dev mode only)
  vllm/v1/worker/gpu_worker.py  Worker.update_config(overrides: dict), Worker.reload_weights()
  vllm/entrypoints/serve/cache/api_router.py  POST /reset_prefix_cache (empty 200, dev mode)
  vllm/entrypoints/serve/dev/rlhf/api_router.py  POST /pause (query mode=abort|wait|keep),
      POST /resume, GET /is_paused, POST /init_weight_transfer_engine {init_info},
      POST /start_weight_update, POST /update_weights {update_info},
      POST /finish_weight_update {weight_version}, POST /update_weight_version {new_version},
      GET /weight_info {weight_version}, GET /get_world_size {world_size}
  vllm/distributed/weight_transfer/nccl_engine.py  NCCLWeightTransferInitInfo {master_address,
      master_port, rank_offset, world_size}; NCCLWeightTransferUpdateInfo {names, dtype_names,
      shapes, packed, ...}
  vllm/entrypoints/serve/dev/server_info/api_router.py  GET /server_info?config_format=json
      {vllm_config: {model_config: {logprobs_mode, ...}}, ...}; logprobs_mode is one of
      raw_logprobs (the default), raw_logits, processed_logprobs, processed_logits
  vllm/v1/engine/parallel_sampling.py  the children of an n > 1 request get seed + index
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch.multiprocessing  # noqa: F401  (the tensor reductions ForkingPickler needs)
from aiohttp import web

EOS = 2
DIGITS = list(range(11, 21))  # the digit tokenizer's "0".."9"


def sample_tokens(seed: int, length: int) -> list[int]:
    """What the stub 'samples': a pure function of the request's seed (as a seeded server's would be)."""
    digest = hashlib.sha256(str(seed).encode()).digest()
    return [DIGITS[b % 10] for b in digest[:length - 1]] + [EOS]


class StubServer:
    """Shared: an aiohttp app on 127.0.0.1, the recorded calls, and the fault switches."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str], Any]] = []
        self.fail: set[str] = set()        # paths that answer HTTP 500 / success false
        self.hang: set[str] = set()        # paths that never answer (until stop)
        self.delay: dict[str, float] = {}  # paths that answer after this many seconds
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.release = asyncio.Event()
        self.busy_s: dict[str, float] = {}  # seconds spent inside each route's handler (benchmarks subtract it)

    def routes(self) -> list[web.RouteDef]:
        raise NotImplementedError

    async def start(self) -> StubServer:
        app = web.Application(client_max_size=256 * 1024 * 1024, middlewares=[self.timed])
        app.add_routes(self.routes())
        app.add_routes([web.route("*", "/{tail:.*}", self.missing)])  # a route this server lacks: 404, recorded
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    @web.middleware
    async def timed(self, request: web.Request, handler: Any) -> web.StreamResponse:
        started = time.perf_counter()
        try:
            return await handler(request)
        finally:
            self.busy_s[request.path] = self.busy_s.get(request.path, 0.0) + time.perf_counter() - started

    async def stop(self) -> None:
        self.release.set()
        await self.runner.cleanup()

    async def record(self, request: web.Request) -> Any:
        body = await request.json() if request.can_read_body else None
        self.calls.append((request.method, request.path, dict(request.query), body))
        if request.path in self.hang:
            await self.release.wait()
            raise web.HTTPServiceUnavailable(text="hung until the test ended")
        if request.path in self.delay:
            await asyncio.sleep(self.delay[request.path])
        return body

    async def missing(self, request: web.Request) -> web.Response:
        self.calls.append((request.method, request.path, dict(request.query), None))
        return web.json_response({"detail": "Not Found"}, status=404)

    def paths(self) -> list[str]:
        return [path for _, path, _, _ in self.calls]

    def bodies(self, path: str) -> list[Any]:
        return [body for _, p, _, body in self.calls if p == path]


class SGLangStub(StubServer):
    """weight_version starts "default" (SGLang's --weight-version default); a restart resets it."""

    def __init__(self) -> None:
        super().__init__()
        self.version = "default"
        self.model_path = "/served/at/start"
        self.tensors: dict[str, Any] = {}

    def restart(self) -> None:
        """The server came back with the weights it was started with."""
        self.version, self.model_path, self.tensors = "default", "/served/at/start", {}

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/generate", self.generate), web.post("/update_weights_from_disk", self.from_disk),
                web.post("/update_weights_from_tensor", self.from_tensor), web.get("/model_info", self.model_info)]

    async def generate(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        params = body["sampling_params"]
        out = []
        for row, p in zip(body["input_ids"], params if isinstance(params, list) else [params] * len(body["input_ids"])):
            tokens = sample_tokens(p["sampling_seed"], min(2, p["max_new_tokens"]))
            out.append({"text": "", "meta_info": {
                "id": "x", "finish_reason": {"type": "stop" if tokens[-1] == EOS else "length"},
                "weight_version": self.version, "prompt_tokens": len(row), "completion_tokens": len(tokens),
                "output_token_logprobs": [[-0.5, t, None] for t in tokens]}})
        return web.json_response(out)

    async def from_disk(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.path in self.fail:
            return web.json_response({"success": False, "message": "Failed to get weights iterator: no such path",
                                      "num_paused_requests": 0}, status=400)
        self.model_path = body["model_path"]
        if body.get("weight_version") is not None:
            self.version = body["weight_version"]
        return web.json_response({"success": True, "message": "Succeeded to update model weights.",
                                  "num_paused_requests": 0})

    async def from_tensor(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.path in self.fail:
            return web.json_response({"success": False, "message": "load failed"}, status=400)
        named = ForkingPickler.loads(base64.b64decode(body["serialized_named_tensors"][0]))  # TP rank 0's
        self.tensors = {name: t.clone() for name, t in named}
        if body.get("weight_version") is not None:
            self.version = body["weight_version"]
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    async def model_info(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"model_path": self.model_path, "tokenizer_path": self.model_path,
                                  "is_generation": True, "preferred_sampling_params": None,
                                  "weight_version": self.version})


class VLLMStub(StubServer):
    """A dev-mode vLLM server: model_config.model is what update_config set, the weights are
    what the last reload loaded; the prefix cache holds blocks computed with the weights of the
    time, and `stale_hits` counts generations that found blocks of older weights."""

    def __init__(self, logprobs_mode: str = "processed_logprobs", dev_mode: bool = True, old: bool = False,
                 root: str = "/served/at/start", world_size: int = 1) -> None:
        super().__init__()
        self.logprobs_mode, self.dev_mode, self.old = logprobs_mode, dev_mode, old
        self.config_model = self.loaded = root
        self.root, self.world_size = root, world_size
        self.version: str | None = "default"
        self.fail_rpc: set[str] = set()  # worker methods that fail (HTTP 500, as an exception in a worker does)
        self.paused = False
        self.cache: dict[tuple, str] = {}  # prompt -> the weights its KV blocks were computed with
        self.stale_hits = 0
        self.short = False  # answer one choice fewer than asked
        self.transfer: dict[str, Any] = {}

    def restart(self) -> None:
        self.config_model = self.loaded = self.root
        self.version, self.cache, self.paused = "default", {}, False

    def routes(self) -> list[web.RouteDef]:
        routes = [web.post("/v1/completions", self.completions), web.get("/v1/models", self.models)]
        if self.dev_mode:
            routes += [web.post("/collective_rpc", self.rpc), web.post("/reset_prefix_cache", self.reset),
                       web.get("/server_info", self.server_info)]
        if self.dev_mode and not self.old:
            routes += [web.post("/pause", self.pause), web.post("/resume", self.resume),
                       web.get("/weight_info", self.weight_info), web.post("/update_weight_version", self.set_version),
                       web.get("/get_world_size", self.get_world_size),
                       web.post("/init_weight_transfer_engine", self.init_transfer),
                       web.post("/start_weight_update", self.start_update), web.post("/update_weights", self.update),
                       web.post("/finish_weight_update", self.finish_update)]
        return routes

    async def completions(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if self.paused:
            return web.json_response({"error": "engine is paused"}, status=503)
        key = tuple(body["prompt"])
        if key in self.cache and self.cache[key] != self.loaded:
            self.stale_hits += 1
        self.cache[key] = self.loaded
        choices = []
        for i in range(body["n"]):
            tokens = sample_tokens(body["seed"] + i, min(2, body["max_tokens"]))  # child i: seed + i
            choices.append({"index": i, "text": "", "finish_reason": "stop" if tokens[-1] == EOS else "length",
                            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens],
                                         "token_logprobs": [-0.75] * len(tokens)}})
        return web.json_response({"id": "cmpl-1", "object": "text_completion", "model": body["model"],
                                  "choices": choices[::-1][: len(choices) - self.short]})

    async def models(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model", "root": self.root}]})

    async def server_info(self, request: web.Request) -> web.Response:
        await self.record(request)
        config: Any = {"model_config": {"model": self.config_model, "logprobs_mode": self.logprobs_mode}}
        if request.query.get("config_format") != "json":
            config = f"model='{self.config_model}', logprobs_mode='{self.logprobs_mode}'"
        return web.json_response({"vllm_config": config, "vllm_env": {}, "system_env": {}})

    async def rpc(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        method = body["method"]
        if method == "update_config":
            (overrides,) = body["args"]
            self.config_model = overrides["model_config"]["model"]
        elif method == "reload_weights":
            if "reload_weights" in self.fail_rpc:
                return web.Response(status=500, text="Internal Server Error: CUDA out of memory")
            self.loaded = self.config_model
        else:
            return web.Response(status=500, text=f"Worker has no method {method}")
        return web.json_response({"results": [None] * self.world_size})

    async def reset(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.cache.clear()
        return web.Response(status=200)

    async def pause(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.paused = True
        if request.query.get("mode", "abort") != "keep":
            self.cache.clear()  # clear_cache defaults to True
        return web.json_response({"status": "paused"})

    async def resume(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.paused = False
        return web.json_response({"status": "resumed"})

    async def weight_info(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"weight_version": self.version})

    async def set_version(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        self.version = body["new_version"]
        return web.json_response({"success": True, "new_version": self.version})

    async def get_world_size(self, request: web.Request) -> web.Response:
        await self.record(request)
        return web.json_response({"world_size": self.world_size})

    async def init_transfer(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        self.transfer = {"init_info": body["init_info"]}
        return web.json_response({"message": "Weight transfer initialized"})

    async def start_update(self, request: web.Request) -> web.Response:
        await self.record(request)
        self.transfer["started"] = True
        return web.json_response({"message": "Weight update started"})

    async def update(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        if request.path in self.fail:
            return web.Response(status=500, text="Internal Server Error: broadcast failed")
        self.transfer["update_info"] = body["update_info"]
        return web.json_response({"message": "Weights updated"})

    async def finish_update(self, request: web.Request) -> web.Response:
        body = await self.record(request)
        self.loaded = f"tensors@{body.get('weight_version')}"
        if body.get("weight_version") is not None:
            self.version = body["weight_version"]
        return web.json_response({"message": "Weight update finished"})


def decode_sglang_tensors(serialized: str) -> dict[str, Any]:
    """Read what SGLang's MultiprocessingSerializer.deserialize would."""
    return {name: t for name, t in ForkingPickler.loads(base64.b64decode(serialized))}

