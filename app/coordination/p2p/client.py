"""Signed HTTP client for node-to-node calls, with short timeouts.

A peer that does not answer in time is simply "no answer": callers treat a None result as a
missing vote / ack / gossip reply, never as an exception to unwind.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from app.coordination.p2p.auth import sign

M = TypeVar("M", bound=BaseModel)


class MeshClient:
    def __init__(self, secret: bytes, timeout: float) -> None:
        self.secret = secret
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=15),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self, method: str, addr: str, path: str, body: Any = None, timeout: float | None = None
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text); raises aiohttp/asyncio errors on transport failure."""
        if isinstance(body, BaseModel):
            raw = body.model_dump_json().encode()
        elif body is None:
            raw = b""
        else:
            raw = json.dumps(body).encode()
        headers = sign(self.secret, method, path, raw)
        headers["Content-Type"] = "application/json"
        kwargs: dict[str, Any] = {"data": raw, "headers": headers}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        async with self._sess().request(method, f"http://{addr}{path}", **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except json.JSONDecodeError:
                return resp.status, text

    async def post(self, addr: str, path: str, body: Any, model: type[M], timeout: float | None = None) -> M | None:
        """POST and parse a 2xx/409 JSON answer into `model`; None when no usable answer."""
        try:
            status, data = await self.request("POST", addr, path, body, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
        if status >= 500 or status in (400, 401, 413) or not isinstance(data, dict):
            return None
        try:
            return model.model_validate(data)
        except ValidationError:
            return None

    async def get_json(self, addr: str, path: str, timeout: float | None = None) -> Any | None:
        try:
            status, data = await self.request("GET", addr, path, None, timeout)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return None
        return data if status == 200 else None
