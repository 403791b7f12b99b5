"""Signed HTTP client for node-to-node calls, with short timeouts, that believes only signed answers.

A peer that does not answer in time is simply "no answer": callers treat a None result as a
missing vote / ack / gossip reply, never as an exception to unwind. An answer that is not the
signed answer of the node asked (answers.py) is no answer either: it is counted and logged as a
refusal (`mesh_refusals_total{direction="in", reason="answer_*"}`) and raises AnswerRefused, an
aiohttp.ClientError, so every caller that survives a dead peer survives a lying one.

Every request names its receiver and the receiver's boot (auth.py). The client learns both from
the signed answer to `GET /mesh/hello` and from every signed answer after it; a 401 saying the
receiver or its boot changed (a restart) refreshes that and retries once.
"""

from __future__ import annotations

import asyncio
import secrets
import ssl
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp
import yarl
from pydantic import BaseModel, ValidationError

from app.coordination.p2p.answers import UNSIGNED_REFUSALS, check_answer
from app.coordination.p2p.auth import BOOT_HEADER, FROM_HEADER, NONCE_HEADER, SIG_HEADER, TO_HEADER, sign
from app.coordination.p2p.identity import AuthError, Identity, as_identity
from app.coordination.p2p.jsonwire import BadJson, dumps, parse_json
from app.coordination.p2p.refusals import Refusals

M = TypeVar("M", bound=BaseModel)
RETRY_CODES = ("receiver", "boot")
REFUSALS = UNSIGNED_REFUSALS  # answers that mean "your message was refused", not a protocol "no"
# An answer this large (a page of games, a replica batch) is parsed in a worker thread: its
# Python-level parsing then yields to the event loop, whose heartbeats must not wait for it.
PARSE_IN_THREAD_BYTES = 256 * 1024


class AnswerRefused(aiohttp.ClientError):
    """The answer is not the signed answer of the node asked; the message says why."""


def unsigned_refusal(status: int, headers: Any) -> bool:
    """A refusal the node could not sign (it could not authenticate the request): believed
    only as a refusal, never as data."""
    return status in REFUSALS and SIG_HEADER not in headers


class MeshClient:
    def __init__(self, secret: bytes | str | Identity, timeout: float, node_id: str = "operator",
                 ssl_context: ssl.SSLContext | None = None, refusals: Refusals | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        """`secret`: the cluster secret, or this node's Identity (identity.py)."""
        self.identity = as_identity(secret)
        self.timeout = timeout
        self.node_id = node_id  # the sender every request names (with node keys: the id of our certificate)
        self.ssl_context = ssl_context
        self.scheme = "https" if ssl_context is not None else "http"
        self.refusals = refusals
        self.clock = clock  # the wall clock our signed timestamps come from
        self.peers: dict[str, tuple[str, int]] = {}  # addr -> (node id, boot) that answered there, signed
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

    # -- answers -------------------------------------------------------------------------
    def check(self, addr: str, request_headers: dict[str, str], status: int, headers: Any,
              body: bytes | None, *, method: str, path: str) -> str:
        """The node whose signed answer this is (to the request sent with `request_headers`);
        AnswerRefused, counted, otherwise. `body` None: a streamed body the caller verifies."""
        expected = request_headers.get(TO_HEADER) or None
        try:
            answerer = check_answer(self.identity, asker=request_headers[FROM_HEADER], expected=expected,
                                    nonce=request_headers[NONCE_HEADER], status=status, headers=headers, body=body,
                                    method=method, path=path)
        except AuthError as exc:
            if self.refusals is not None:
                self.refusals.refused_in(expected or addr, exc.code, str(exc)[:300])
            raise AnswerRefused(f"{addr}: {exc}") from None
        boot = headers.get(BOOT_HEADER)
        if boot and boot.isdigit():
            self.peers[addr] = (answerer, int(boot))
        return answerer

    def answer_middleware(self):  # type: ignore[no-untyped-def]
        """An aiohttp client middleware that checks every answer's signature (streamed bodies:
        the headers; their content is checked against the sha256 asked for by the caller)."""
        async def middleware(request: aiohttp.ClientRequest, handler):  # type: ignore[no-untyped-def]
            response = await handler(request)
            sent = {k: v for k, v in request.headers.items()}
            if FROM_HEADER in sent and NONCE_HEADER in sent:
                if not unsigned_refusal(response.status, response.headers):
                    self.check(f"{request.url.host}:{request.url.port}", sent, response.status, response.headers, None,
                               method=request.method, path=request.url.path)
            return response
        return middleware

    async def identify(self, addr: str, refresh: bool = False, timeout: float | None = None) -> tuple[str, int] | None:
        """(node id, boot) of the node at `addr`: cached, else from its signed answer to the
        public GET /mesh/hello."""
        if not refresh and addr in self.peers:
            return self.peers[addr]
        kwargs: dict[str, Any] = {}
        if timeout is not None:
            kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
        asked = {FROM_HEADER: self.node_id, NONCE_HEADER: secrets.token_hex(16)}
        async with self._sess().get(self.url(addr, "/mesh/hello"), headers=asked, **kwargs) as resp:
            raw = await resp.read()
            status, headers = resp.status, resp.headers
        if status != 200:
            return self.peers.get(addr)
        answerer = self.check(addr, asked, status, headers, raw, method="GET", path="/mesh/hello")
        try:
            data = parse_json(raw)
        except BadJson:
            data = None
        if isinstance(data, dict) and data.get("node_id") == answerer and isinstance(data.get("boot"), int):
            self.peers[addr] = (answerer, data["boot"])
        return self.peers.get(addr)

    # -- requests ------------------------------------------------------------------------
    async def signed_headers(self, addr: str, method: str, path: str, body: bytes = b"",
                             sender: str | None = None, expect: str | None = None) -> dict[str, str]:
        """Headers for one request to whoever answers at `addr` (for callers streaming themselves,
        whose session carries `answer_middleware`); `sender` defaults to this client's node id.
        `expect`: the node the caller means to reach; another one at `addr` is AnswerRefused."""
        ident = await self.identify(addr)
        receiver, boot = ident if ident is not None else ("", 0)
        if expect is not None and receiver != expect:
            raise AnswerRefused(f"{addr}: {receiver or 'nobody'} answers there, not {expect}")
        return sign(self.identity, method, path, body, sender=sender or self.node_id, receiver=receiver, boot=boot,
                    now=self.clock())

    async def request(
        self, method: str, addr: str, path: str, body: Any = None, timeout: float | None = None,
        sender: str | None = None, expect: str | None = None,
    ) -> tuple[int, Any]:
        """(status, parsed JSON or text) of the signed answer; an unsigned refusal (400, 401, 408,
        413) comes back as such. Raises aiohttp/asyncio errors on transport failure and
        AnswerRefused on an answer that is not the asked node's."""
        if isinstance(body, BaseModel):
            raw = body.model_dump_json().encode()
        elif body is None:
            raw = b""
        elif isinstance(body, bytes):  # already JSON
            raw = body
        else:
            raw = dumps(body).encode()
        for attempt in range(2):
            headers = await self.signed_headers(addr, method, path, raw, sender, expect)
            headers["Content-Type"] = "application/json"
            kwargs: dict[str, Any] = {"data": raw, "headers": headers}
            if timeout is not None:
                kwargs["timeout"] = aiohttp.ClientTimeout(total=timeout)
            async with self._sess().request(method, self.url(addr, path), **kwargs) as resp:
                text = await resp.read()
                status, answer_headers = resp.status, resp.headers
            if not unsigned_refusal(status, answer_headers):
                self.check(addr, headers, status, answer_headers, text, method=method,
                           path=yarl.URL(self.url(addr, path)).path)
            try:
                data = None if not text else (await asyncio.to_thread(parse_json, text)
                                              if len(text) >= PARSE_IN_THREAD_BYTES else parse_json(text))
            except BadJson:
                data = text.decode(errors="replace")
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

    async def post(self, addr: str, path: str, body: Any, model: type[M], timeout: float | None = None,
                   expect: str | None = None) -> M | None:
        """POST and parse a 2xx/409 JSON answer into `model`; None when no usable answer.
        `expect`: the node meant (an answer from another is no answer)."""
        try:
            status, data = await self.request("POST", addr, path, body, timeout, expect=expect)
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
