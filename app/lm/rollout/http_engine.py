"""What the SGLang and vLLM engines share: HTTP calls that name the engine in every error, a
synchronous face for the rollout code, and the out-of-service rule.

One short-lived aiohttp session per call, so no event loop is ever captured (self-play calls
from a worker thread, weight syncs from the node's loop). Generation requests are bounded by
`request_timeout_s`; the calls of a weight load by the engine's `sync_timeout_s` (the
configured one, never the generation timeout), which weight_sync also puts on the whole load.

An engine is out of service from a failed or timed-out sync, or from a generation whose
answer shows other weights than the last confirmed load (a server restarted with its old
weights), until a sync succeeds; it refuses to generate meanwhile (`EngineOutOfService`), so
nothing it produces can be stored with a wrong label.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from app.lm.rollout.engine import Completion, EngineError, EngineOutOfService, WeightUpdate

FINISH_REASONS = ("stop", "length", "abort")


class HttpEngine:
    kind = "http"

    def __init__(self, name: str, base_url: str, *, weight_version: int = 0, request_timeout_s: float = 120.0,
                 sync_timeout_s: float = 300.0, sync_mode: str = "disk") -> None:
        if sync_mode not in ("disk", "tensor"):
            raise ValueError(f"engine {name}: sync mode {sync_mode!r} is neither disk nor tensor")
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.weight_version = weight_version
        self.request_timeout_s = request_timeout_s
        self.sync_timeout_s = sync_timeout_s
        self.sync_mode = sync_mode
        self.in_service = False  # until a load is confirmed: the server's weights are unknown
        self.last_error: str | None = "no weights loaded by this node yet"
        self.lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.base_url!r})"

    def _fail(self, what: str) -> EngineError:
        return EngineError(f"{self.kind} engine {self.name}: {what}")

    def adopt(self, version: int) -> None:
        """Another rank of the same trainer loaded `version` into this server and the server
        confirmed it: this client generates with it too (each answer is still checked against
        it, so a server that did not load it is caught at the first generation)."""
        self.weight_version, self.in_service, self.last_error = version, True, None

    def take_out_of_service(self, why: str) -> EngineOutOfService:
        self.in_service, self.last_error = False, why
        return EngineOutOfService(f"{self.kind} engine {self.name}: out of service: {why}")

    async def request(self, method: str, path: str, payload: Any = None, *, params: Mapping[str, str] | None = None,
                      timeout_s: float | None = None, allow_missing: bool = False,
                      session: aiohttp.ClientSession | None = None) -> Any:
        """The JSON answer (None for an empty 200). `allow_missing`: a 404 answers the sentinel
        MISSING instead of failing (a route an older server does not have). `session`: one the
        caller shares across the requests of a batch (its connections are reused)."""
        if session is None:
            async with aiohttp.ClientSession() as own:
                return await self.request(method, path, payload, params=params, timeout_s=timeout_s,
                                          allow_missing=allow_missing, session=own)
        url = f"{self.base_url}{path}"
        limit = self.request_timeout_s if timeout_s is None else timeout_s
        try:
            async with session.request(method, url, json=payload, params=params,
                                       timeout=aiohttp.ClientTimeout(total=limit)) as resp:
                body = await resp.text()
                if resp.status == 404 and allow_missing:
                    return MISSING
                if resp.status != 200:
                    raise self._fail(f"{method} {path} -> HTTP {resp.status}: {body[:300]}")
                if not body.strip():
                    return None
                try:
                    return await resp.json(content_type=None)
                except ValueError:
                    if resp.content_type.startswith("text/"):
                        return body
                    raise self._fail(f"{method} {path} answered non-JSON: {body[:200]!r}") from None
        except aiohttp.ClientError as exc:
            raise self._fail(f"{method} {url} failed: {exc!r}") from exc
        except TimeoutError:
            raise self._fail(f"{method} {path}: no answer within {limit:g}s") from None

    def generate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int = 1, max_new_tokens: int,
                 temperature: float = 1.0, seeds: Sequence[int],
                 stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        """Synchronous face of `agenerate`, for the rollout code that the in-process engine shares."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            with self.lock:
                return asyncio.run(self.agenerate(prompt_token_lists, n=n, max_new_tokens=max_new_tokens,
                                                  temperature=temperature, seeds=seeds, stop_token_ids=stop_token_ids))
        raise RuntimeError(f"{self.name}: generate() called inside an event loop; await agenerate() instead")

    async def agenerate(self, prompt_token_lists: Sequence[Sequence[int]], *, n: int, max_new_tokens: int,
                        temperature: float, seeds: Sequence[int],
                        stop_token_ids: Sequence[int] | None = None) -> list[list[Completion]]:
        if not self.in_service:
            raise EngineOutOfService(f"{self.kind} engine {self.name}: out of service: {self.last_error}")
        return await self._generate(prompt_token_lists, n, max_new_tokens, temperature, seeds, stop_token_ids)

    async def _generate(self, prompt_token_lists: Sequence[Sequence[int]], n: int, max_new_tokens: int,
                        temperature: float, seeds: Sequence[int],
                        stop_token_ids: Sequence[int] | None) -> list[list[Completion]]:
        raise NotImplementedError

    async def start(self) -> None:
        """Start-up checks; none by default."""

    async def load(self, update: WeightUpdate) -> int:
        if self.sync_mode == "disk":
            if update.path is None:
                raise self._fail(f"syncs from disk, but the update to version {update.version} has no directory")
            return await self._load_from_disk(update)
        if update.tensors is None:
            raise self._fail(f"syncs tensors, but the update to version {update.version} has none")
        return await self._load_tensors(update)

    async def _load_from_disk(self, update: WeightUpdate) -> int:
        raise NotImplementedError

    async def _load_tensors(self, update: WeightUpdate) -> int:
        raise NotImplementedError

    def _finish(self, reason: Any) -> str:
        if reason not in FINISH_REASONS:
            raise self._fail(f"unknown finish_reason {reason!r}")
        return reason


class _Missing:
    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()  # a 404 where a route may be absent (an older server)
