"""Signed HTTP client for node-to-node calls, with short timeouts.

A peer that does not answer in time is simply "no answer": callers treat a None result as a
missing vote / ack / gossip reply, never as an exception to unwind.

Every request names its receiver and the receiver's boot (auth.py). The client learns both from
the `X-Mesh-Node` / `X-Mesh-Boot` headers of every answer, or asks `GET /mesh/hello` first; a 401
saying the receiver or its boot changed (a restart) refreshes that and retries once.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
from pydantic import BaseModel, ValidationError

from app.coordination.p2p.auth import BOOT_HEADER, NODE_HEADER, sign
from app.coordination.p2p.refusals import Refusals

M = TypeVar("M", bound=BaseModel)
RETRY_CODES = ("receiver", "boot")
REFUSALS = (400, 401, 408, 413)  # answers that mean "your message was refused", not a protocol "no"


class MeshClient:
    def __init__(self, secret: bytes, timeout: float, node_id: str = "operator",
                 ssl_context: ssl.SSLContext | None = None, refusals: Refusals | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.secret = secret
        self.timeout = timeout
        self.node_id = node_id  # the sender every request names (with TLS: the id of our certificate)
        self.ssl_context = ssl_context
        self.scheme = "https" if ssl_context is not None else "http"
        self.refusals = refusals
        self.clock = clock  # the wall clock our signed timestamps come from
        self.peers: dict[str, tuple[str, int]] = {}  # addr -> (node id, boot) that answered there
        self._session: aiohttp.ClientSession | None = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout),
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=15, ssl=self.ssl_context or True),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def url(self, addr: str, path: str) -> str:
        return f"{self.scheme}://{addr}{path}"

    def learn(self, addr: str, headers: Any) -> None:
        """Remember who answers at `addr` (from an answer's X-Mesh-Node / X-Mesh-Boot)."""
        node, boot = headers.get(NODE_HEADER), headers.get(BOOT_HEADER)
        if node and boot and boot.isdigit():
            self.peers[addr] = (node, int(boot))

    async def identify(self, addr: str, refresh: bool = False, timeout: float | None = None) -> tuple[str, int] | None:
        """(node id, boot) of the node at `addr`: cached, else from its public GET /mesh/hello."""
        if not refresh and addr in self.peers:
            return self.peers[addr]
        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        async with self._sess().get(self.url(addr, "/mesh/hello"), **kwargs) as resp:
            self.learn(addr, resp.headers)
            if resp.status == 200:
                data = await resp.json()
                if isinstance(data, dict) and isinstance(data.get("node_id"), str) and isinstance(data.get("boot"), int):
                    self.peers[addr] = (data["node_id"], data["boot"])
        return self.peers.get(addr)

    async def signed_headers(self, addr: str, method: str, path: str, body: bytes = b"",
                             sender: str | None = None) -> dict[str, str]:
        """Headers for one request to whoever answers at `addr` (for callers streaming themselves);
        `sender` defaults to this client's node id."""
        ident = await self.identify(addr)
        receiver, boot = ident if ident is not None else ("", 0)
        return sign(self.secret, method, path, body, sender=sender or self.node_id, receiver=receiver, boot=boot,
                    now=self.clock())

    async def request(
        self, method: str, addr: str, path: str, body: Any = None, timeout: float | None = None,
        sender: str | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text); raises aiohttp/asyncio errors on transport failure."""
        if isinstance(body, BaseModel):
            raw = body.model_dump_json().encode()
        elif body is None:
            raw = b""
        else:
            raw = json.dumps(body).encode()
        for attempt in range(2):
            headers = await self.signed_headers(addr, method, path, raw, sender)
            headers["Content-Type"] = "application/json"
            kwargs: dict[str, Any] = {"data": raw, "headers": headers}
            if timeout is not None:
                kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
            async with self._sess().request(method, self.url(addr, path), **kwargs) as resp:
                self.learn(addr, resp.headers)
                text = await resp.text()
                status = resp.status
            try:
                data = json.loads(text) if text else None
            except json.JSONDecodeError:
                data = text
            code = data.get("code") if isinstance(data, dict) else None
            if status == 401 and code in RETRY_CODES and attempt == 0:
                await self.identify(addr, refresh=True, timeout=timeout)  # it restarted, or another node took the port
                continue
            if status in REFUSALS and self.refusals is not None:
                peer = self.peers.get(addr, (addr, 0))[0]
                reason = data.get("error", "") if isinstance(data, dict) else str(data)[:200]
                self.refusals.refused_out(peer, str(code or status), str(reason)[:300])
            return status, data
        raise AssertionError("unreachable")

    async def post(self, addr: str, path: str, body: Any, model: type[M], timeout: float | None = None) -> M | None:
        """POST and parse a 2xx/409 JSON answer into `model`; None when no usable answer."""
        try:
            status, data = await self.request("POST", addr, path, body, timeout)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        if status >= 500 or status in REFUSALS or not isinstance(data, dict):
            return None
        try:
            return model.model_validate(data)
        except ValidationError:
            return None

    async def get_json(self, addr: str, path: str, timeout: float | None = None) -> Any | None:
        try:
            status, data = await self.request("GET", addr, path, None, timeout)
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            return None
        return data if status == 200 else None
