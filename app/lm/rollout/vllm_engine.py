"""A vLLM server as an engine. The server runs with VLLM_SERVER_DEV_MODE=1 (the weight-update
and cache routes are development routes) and `--logprobs-mode processed_logprobs`: by default
vLLM reports log-probs of the raw logits, before temperature, and the trainer compares the
log-probs of the distribution it sampled from (logits / T), so a server in another mode is
refused at start-up with the flag to add.

Routes and field names are vLLM's own:

    POST /v1/completions            {model, prompt (token ids), n, max_tokens, temperature, seed,
                                    logprobs: 0, return_tokens_as_token_ids, ...}; the children of
                                    an n > 1 request are drawn with seed + index
                                    (vllm/v1/engine/parallel_sampling.py)
    GET  /server_info?config_format=json
                                    {vllm_config: {model_config: {logprobs_mode, ...}}}: how a client
                                    learns the log-prob mode (vllm/entrypoints/serve/dev/server_info/
                                    api_router.py); an older server answers text, searched for
                                    `logprobs_mode=`; no answer at all is refused (dev mode is off)
    GET  /v1/models                 data[0].root: the served model's path, the config a failed load
                                    is undone to
    POST /pause, POST /resume       native pause around every load (vllm/entrypoints/serve/dev/rlhf/
                                    api_router.py); an older server without them gets the prefix
                                    cache reset alone
    POST /collective_rpc            {method, args, kwargs, timeout} (vllm/entrypoints/serve/rpc/
                                    api_router.py): the worker methods update_config(overrides) and
                                    reload_weights() (vllm/v1/worker/gpu_worker.py)
    POST /reset_prefix_cache        after every load: V1 keeps KV blocks computed with old weights
                                    (vllm/entrypoints/serve/cache/api_router.py)
    POST /update_weight_version     {new_version}; GET /weight_info -> {weight_version}: the version
                                    read back after a load (an older server without them: the load's
                                    own answer is the only confirmation)
    tensor path (rlhf api_router.py, vllm/distributed/weight_transfer/nccl_engine.py):
    POST /init_weight_transfer_engine {init_info: {master_address, master_port, rank_offset,
                                    world_size}} once; per load POST /start_weight_update,
                                    POST /update_weights {update_info: {names, dtype_names, shapes,
                                    packed}} while the trainer broadcasts the tensors over NCCL,
                                    POST /finish_weight_update {weight_version}

A disk load that fails after `update_config` points the model back at the path it served
before, so the server's config is as it was; the engine is out of service either way until a
load succeeds.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from typing import Any, Protocol

import aiohttp
import torch

from app.lm.rollout.engine import Completion, EngineError, WeightUpdate, check_seeds
from app.lm.rollout.http_engine import MISSING, HttpEngine

PROCESSED = "processed_logprobs"
FLAG_HINT = ("start vLLM with `--logprobs-mode processed_logprobs` (and VLLM_SERVER_DEV_MODE=1, which the "
             "weight-update routes need too)")
CLEANUP_S = 5.0  # at most this long for each call that puts the server back after a failed load


class TensorSender(Protocol):
    """The trainer's side of vLLM's NCCL weight transfer: joins the group, broadcasts tensors."""

    def init(self, master_address: str, master_port: int, world_size: int) -> None: ...
    def send(self, named: Sequence[tuple[str, torch.Tensor]]) -> None: ...


class VLLMNcclSender:
    """vLLM's own trainer side (NCCLWeightTransferEngine.trainer_init / trainer_send_weights):
    the broadcast needs vLLM's StatelessProcessGroup and pynccl, so vllm must be installed beside
    the trainer, which must hold a GPU."""

    def __init__(self) -> None:
        try:
            from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferEngine
        except ImportError as exc:
            raise EngineError("tensor sync to vLLM broadcasts over NCCL with vLLM's trainer side: install vllm "
                              f"beside the trainer, or use sync: disk ({exc})") from None
        self._engine = NCCLWeightTransferEngine
        self._group: Any = None

    def init(self, master_address: str, master_port: int, world_size: int) -> None:
        self._group = self._engine.trainer_init({"master_address": master_address, "master_port": master_port,
                                                 "world_size": world_size})

    def send(self, named: Sequence[tuple[str, torch.Tensor]]) -> None:
        self._engine.trainer_send_weights(iter([(n, t.cuda()) for n, t in named]),
                                          {"group": self._group, "packed": False})


def logprobs_mode(server_info: Any) -> str | None:
    """The mode a /server_info answer shows: JSON config, or `logprobs_mode='...'` in its text."""
    config = server_info.get("vllm_config") if isinstance(server_info, dict) else server_info
    if isinstance(config, dict):
        mode = (config.get("model_config") or {}).get("logprobs_mode")
        return str(mode) if mode is not None else None
    found = re.search(r"logprobs_mode=['\"]?(\w+)", str(config))
    return found.group(1) if found else None


class VLLMEngine(HttpEngine):
    kind = "vllm"

    def __init__(self, name: str, base_url: str, *, model: str = "default", rpc_timeout_s: float = 300.0,
                 nccl_master: str | None = None, sender: TensorSender | None = None, **kwargs: Any) -> None:
        super().__init__(name, base_url, **kwargs)
        self.model = model
        self.rpc_timeout_s = rpc_timeout_s
        self.nccl_master = nccl_master
        self.sender = sender
        self.model_path: str | None = None     # what the server serves: a failed load is undone to it
        self.native_pause = True               # until the server answers /pause with 404
        self.reports_version = True            # until the server answers /weight_info with 404
        self.started = False

    # -- start-up ---------------------------------------------------------------------------
    async def start(self) -> None:
        """Refuse a server whose log-probs are not the sampled distribution's; learn the path it
        serves; set up the NCCL group of the tensor path."""
        info = await self.request("GET", "/server_info", params={"config_format": "json"}, allow_missing=True)
        if info is MISSING:
            raise self._fail(f"/server_info is not served, so its log-prob mode is unknown: {FLAG_HINT}")
        mode = logprobs_mode(info)
        if mode != PROCESSED:
            raise self._fail(f"the server reports log-probs in mode {mode!r}, before temperature and sampling "
                             f"processors, but the trainer needs the sampled distribution's: {FLAG_HINT}")
        models = await self.request("GET", "/v1/models")
        try:
            self.model_path = str(models["data"][0]["root"])
        except (KeyError, IndexError, TypeError):
            raise self._fail(f"/v1/models names no served model: {models!r}") from None
        shown = await self.request("GET", "/weight_info", allow_missing=True)
        self.reports_version = shown is not MISSING
        if self.sync_mode == "tensor":
            await self._init_transfer()
        self.started = True

    async def _init_transfer(self) -> None:
        if not self.nccl_master or ":" not in self.nccl_master:
            raise self._fail("sync: tensor needs nccl_master 'host:port' for the trainer's NCCL group")
        if self.sender is None:
            self.sender = VLLMNcclSender()
        size = await self.request("GET", "/get_world_size", params={"include_dp": "true"})
        host, port = self.nccl_master.rsplit(":", 1)
        world = int(size["world_size"]) + 1  # the trainer is rank 0, the server's workers follow
        info = {"master_address": host, "master_port": int(port), "rank_offset": 1, "world_size": world}
        await asyncio.gather(self.request("POST", "/init_weight_transfer_engine", {"init_info": info},
                                          timeout_s=self.sync_timeout_s),
                             asyncio.to_thread(self.sender.init, host, int(port), world))

    # -- generation -------------------------------------------------------------------------
    async def _generate(self, prompt_token_lists, n, max_new_tokens, temperature, seeds,
                        stop_token_ids) -> list[list[Completion]]:
        check_seeds(prompt_token_lists, seeds)

        async def one(prompt: Sequence[int], seed: int, session: aiohttp.ClientSession) -> list[Completion]:
            payload = {"model": self.model, "prompt": list(prompt), "n": n, "max_tokens": max_new_tokens,
                       "temperature": temperature, "seed": int(seed), "logprobs": 0,
                       "return_tokens_as_token_ids": True, "stop_token_ids": list(stop_token_ids or []),
                       "skip_special_tokens": False, "include_stop_str_in_output": True}
            answer = await self.request("POST", "/v1/completions", payload, session=session)
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or len(choices) != n:
                raise self._fail(f"/v1/completions answered {len(choices) if isinstance(choices, list) else 'no'} "
                                 f"choices for n={n}")
            return [self._completion(c) for c in sorted(choices, key=lambda c: c.get("index", 0))]

        async with aiohttp.ClientSession() as session:  # one request a prompt, over shared connections
            out = list(await asyncio.gather(*(one(p, s, session) for p, s in zip(prompt_token_lists, seeds))))
        if self.reports_version:
            shown = (await self.request("GET", "/weight_info") or {}).get("weight_version")
            if str(shown) != str(self.weight_version):
                raise self.take_out_of_service(f"/weight_info shows {shown!r} after generating, but the last "
                                               f"confirmed load was {self.weight_version} (restarted?)")
        return out

    def _completion(self, choice: dict) -> Completion:
        try:
            tokens = [int(str(t).removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._fail(f"/v1/completions choice lacks token ids / log-probs: {exc!r}") from exc
        if len(tokens) != len(logprobs):
            raise self._fail(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        return Completion(tokens=tokens, logprobs=logprobs, finish_reason=self._finish(choice.get("finish_reason")),
                          weight_version=self.weight_version)

    # -- loads ------------------------------------------------------------------------------
    async def _rpc(self, method: str, args: list, timeout_s: float | None = None) -> Any:
        payload = {"method": method, "args": args, "kwargs": {}, "timeout": self.rpc_timeout_s}
        return await self.request("POST", "/collective_rpc", payload, timeout_s=timeout_s or self.sync_timeout_s)

    async def _load_from_disk(self, update: WeightUpdate) -> int:
        if not self.started:
            raise self._fail("start() was not called: the served model path to undo a failed load to is unknown")
        new = str(update.path)
        async with self._paused():
            await self._rpc("update_config", [{"model_config": {"model": new}}])
            try:
                await self._rpc("reload_weights", [])
            except BaseException as exc:
                problem = await self._undo_config()
                if problem is not None and isinstance(exc, Exception):
                    raise self._fail(f"{exc}; and undoing update_config failed too: {problem}") from exc
                raise
            self.model_path = new
            return await self._confirm(update.version)

    async def _undo_config(self) -> str | None:
        """Point the model back at what it served before; why that failed, if it did."""
        try:
            await self._rpc("update_config", [{"model_config": {"model": self.model_path}}],
                            timeout_s=min(CLEANUP_S, self.sync_timeout_s))
        except (EngineError, asyncio.CancelledError) as exc:
            return f"update_config back to {self.model_path}: {exc or type(exc).__name__}"
        return None

    async def _load_tensors(self, update: WeightUpdate) -> int:
        if not self.started or self.sender is None:
            raise self._fail("start() was not called: the NCCL group of the tensor path is not set up")
        assert update.tensors is not None
        named = list(update.tensors().items())
        info = {"names": [n for n, _ in named], "dtype_names": [str(t.dtype).removeprefix("torch.") for _, t in named],
                "shapes": [list(t.shape) for _, t in named], "packed": False}
        async with self._paused():
            await self.request("POST", "/start_weight_update", {}, timeout_s=self.sync_timeout_s)
            await asyncio.gather(self.request("POST", "/update_weights", {"update_info": info},
                                              timeout_s=self.sync_timeout_s),
                                 asyncio.to_thread(self.sender.send, named))
            await self.request("POST", "/finish_weight_update", {"weight_version": str(update.version)},
                               timeout_s=self.sync_timeout_s)
            return await self._confirm(update.version, set_version=False)

    async def _confirm(self, version: int, set_version: bool = True) -> int:
        """Reset the prefix cache, then read back the version the server reports (when it keeps one)."""
        await self.request("POST", "/reset_prefix_cache", timeout_s=self.sync_timeout_s)
        if not self.reports_version:
            return version
        if set_version:
            await self.request("POST", "/update_weight_version", {"new_version": str(version)},
                               timeout_s=self.sync_timeout_s)
        shown = (await self.request("GET", "/weight_info", timeout_s=self.sync_timeout_s) or {}).get("weight_version")
        if str(shown) != str(version):
            raise self._fail(f"after the load /weight_info shows {shown!r}, expected {str(version)!r}")
        return int(shown)

    def _paused(self) -> _Paused:
        return _Paused(self)


class _Paused:
    """POST /pause before a load, POST /resume after it (also after a failed one)."""

    def __init__(self, engine: VLLMEngine) -> None:
        self.engine = engine

    async def __aenter__(self) -> None:
        e = self.engine
        if e.native_pause:
            answer = await e.request("POST", "/pause", params={"mode": "abort"}, timeout_s=e.sync_timeout_s,
                                     allow_missing=True)
            e.native_pause = answer is not MISSING

    async def __aexit__(self, *exc: object) -> None:
        e = self.engine
        if e.native_pause:
            try:
                await e.request("POST", "/resume", timeout_s=min(CLEANUP_S, e.sync_timeout_s))
            except (EngineError, asyncio.CancelledError):
                if exc[0] is None:  # after a failed load, that failure is the error to report
                    raise
