"""Generation engines behind HTTP: an SGLang server and a vLLM server.

Both speak token ids (never text) so the trainer sees exactly the tokens that were sampled,
and both return the log-prob of every sampled token. Every error names the engine.

Weight updates load a Hugging Face checkpoint directory that the engine can read:
- SGLang: `POST /update_weights_from_disk {model_path, weight_version, flush_cache,
  abort_all_requests}`, then `GET /model_info` must report the new `weight_version`;
- vLLM (server in dev mode): `POST /collective_rpc {method, args, kwargs, timeout}` twice,
  `update_config` pointing the model at the new path, then `reload_weights`. vLLM keeps no
  weight version of its own, so this object records it, and only after both calls succeeded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp

from app.lm.rollout.engine import Completion

FINISH_REASONS = ("stop", "length", "abort")


class EngineError(RuntimeError):
    """An engine refused, failed or answered something we cannot use; the message names it."""


class HttpEngine:
    """Shared HTTP plumbing: one short-lived session per call, so no loop is ever captured."""

    kind = "http"

    def __init__(self, name: str, base_url: str, *, weight_version: int = 0,
                 request_timeout_s: float = 120.0) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.weight_version = weight_version
        self.request_timeout_s = request_timeout_s

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.base_url!r})"

    async def _request(self, method: str, path: str, payload: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s)
        try:
            async with aiohttp.ClientSession(timeout=timeout) as session, \
                    session.request(method, url, json=payload) as resp:
                body = await resp.text()
                if resp.status != 200:
                    raise EngineError(f"{self.kind} engine {self.name}: {method} {path} -> HTTP {resp.status}: "
                                      f"{body[:300]}")
                try:
                    return await resp.json(content_type=None)
                except ValueError as exc:
                    raise EngineError(f"{self.kind} engine {self.name}: {method} {path} answered "
                                      f"non-JSON: {body[:200]!r}") from exc
        except aiohttp.ClientError as exc:
            raise EngineError(f"{self.kind} engine {self.name}: {method} {url} failed: {exc!r}") from exc
        except TimeoutError:
            raise EngineError(f"{self.kind} engine {self.name}: {method} {path}: no answer within "
                              f"{self.request_timeout_s:g}s") from None

    def _fail(self, what: str) -> EngineError:
        return EngineError(f"{self.kind} engine {self.name}: {what}")

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, seed: int = 0,
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        """Synchronous face of `agenerate`, for the rollout code that the in-process engine shares."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.agenerate(prompt_token_lists, n=n, max_new_tokens=max_new_tokens,
                                              temperature=temperature, seed=seed, stop_token_ids=stop_token_ids))
        raise RuntimeError(f"{self.name}: generate() called inside an event loop; await agenerate() instead")

    async def agenerate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int, max_new_tokens: int,
                        temperature: float, seed: int,
                        stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        raise NotImplementedError

    def _finish(self, reason: Any) -> str:
        if reason not in FINISH_REASONS:
            raise self._fail(f"unknown finish_reason {reason!r}")
        return reason


class SGLangEngine(HttpEngine):
    kind = "sglang"

    def __init__(self, name: str, base_url: str, *, abort_all_requests: bool = False, flush_cache: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(name, base_url, **kwargs)
        self.abort_all_requests = abort_all_requests
        self.flush_cache = flush_cache

    async def agenerate(self, prompt_token_lists, *, n, max_new_tokens, temperature, seed,
                        stop_token_ids=None) -> list[list[Completion]]:
        rows = [list(p) for p in prompt_token_lists for _ in range(n)]
        if not rows:
            return []
        payload = {"input_ids": rows, "return_logprob": True,
                   "sampling_params": {"temperature": temperature, "max_new_tokens": max_new_tokens,
                                       "stop_token_ids": list(stop_token_ids or []),
                                       "skip_special_tokens": False, "no_stop_trim": True}}
        answer = await self._request("POST", "/generate", payload)
        if isinstance(answer, dict):
            answer = [answer]
        if not isinstance(answer, list) or len(answer) != len(rows):
            got = len(answer) if isinstance(answer, list) else type(answer).__name__
            raise self._fail(f"/generate answered {got} completions for {len(rows)} requests")
        flat = [self._completion(item) for item in answer]
        return [flat[i * n:(i + 1) * n] for i in range(len(prompt_token_lists))]

    def _completion(self, item: Any) -> Completion:
        try:
            meta = item["meta_info"]
            pairs = meta["output_token_logprobs"]
            reason = meta["finish_reason"]["type"]
        except (KeyError, TypeError) as exc:
            raise self._fail(f"/generate answer lacks meta_info output_token_logprobs/finish_reason: {exc!r}") from exc
        version = meta.get("weight_version")
        return Completion(tokens=[int(p[1]) for p in pairs], logprobs=[float(p[0]) for p in pairs],
                          finish_reason=self._finish(reason),
                          weight_version=int(version) if str(version).isdigit() else None)

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        payload = {"model_path": str(model_path), "weight_version": str(version),
                   "flush_cache": self.flush_cache, "abort_all_requests": self.abort_all_requests}
        answer = await self._request("POST", "/update_weights_from_disk", payload)
        if not isinstance(answer, dict) or answer.get("success") is not True:
            raise self._fail(f"update_weights_from_disk({model_path}) not successful: {answer!r}")
        info = await self._request("GET", "/model_info")
        shown = info.get("weight_version") if isinstance(info, dict) else None
        if str(shown) != str(version):
            raise self._fail(f"after update_weights_from_disk, /model_info shows weight_version {shown!r}, "
                             f"expected {str(version)!r}")
        self.weight_version = version


class VLLMEngine(HttpEngine):
    kind = "vllm"

    def __init__(self, name: str, base_url: str, *, model: str = "default", rpc_timeout_s: float = 300.0,
                 **kwargs: Any) -> None:
        super().__init__(name, base_url, **kwargs)
        self.model = model
        self.rpc_timeout_s = rpc_timeout_s

    async def agenerate(self, prompt_token_lists, *, n, max_new_tokens, temperature, seed,
                        stop_token_ids=None) -> list[list[Completion]]:
        async def one(index: int, prompt: Sequence[int]) -> list[Completion]:
            payload = {"model": self.model, "prompt": list(prompt), "n": n, "max_tokens": max_new_tokens,
                       "temperature": temperature, "seed": seed + index, "logprobs": 0,
                       "return_tokens_as_token_ids": True, "stop_token_ids": list(stop_token_ids or []),
                       "skip_special_tokens": False, "include_stop_str_in_output": True}
            answer = await self._request("POST", "/v1/completions", payload)
            choices = answer.get("choices") if isinstance(answer, dict) else None
            if not isinstance(choices, list) or len(choices) != n:
                raise self._fail(f"/v1/completions answered {len(choices) if isinstance(choices, list) else 'no'} "
                                 f"choices for n={n}")
            return [self._completion(c) for c in sorted(choices, key=lambda c: c.get("index", 0))]

        return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompt_token_lists))))

    def _completion(self, choice: dict) -> Completion:
        try:
            tokens = [int(str(t).removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]]
            logprobs = [float(x) for x in choice["logprobs"]["token_logprobs"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._fail(f"/v1/completions choice lacks token ids / log-probs: {exc!r}") from exc
        if len(tokens) != len(logprobs):
            raise self._fail(f"{len(tokens)} tokens but {len(logprobs)} log-probs")
        return Completion(tokens=tokens, logprobs=logprobs, finish_reason=self._finish(choice.get("finish_reason")))

    async def _rpc(self, method: str, args: list) -> Any:
        payload = {"method": method, "args": args, "kwargs": {}, "timeout": self.rpc_timeout_s}
        return await self._request("POST", "/collective_rpc", payload)

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None:
        await self._rpc("update_config", [{"model_config": {"model": str(model_path)}}])
        await self._rpc("reload_weights", [])
        self.weight_version = version
