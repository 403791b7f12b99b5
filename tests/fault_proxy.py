"""A fault-injecting HTTP proxy for the mesh links of real nodes: one listening port per directed
link (src -> dst), so a node configured with `--peers dst@127.0.0.1:<proxy port>` sends its
requests to dst through it. It forwards every request unchanged (a signed request stays valid:
the proxy changes no byte the signature covers) and lets a test act on what passes: a hook sees
each request and its answer on the link and may answer in place of the receiver (None: forward
the answer), and a `before` hook may hold a request back before it is forwarded. Runs its own event loop in a thread, so tests that drive nodes synchronously can
use it; hooks run on that loop, one at a time.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from tests.mesh_helpers import free_ports

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding",
              "upgrade", "te", "trailer", "proxy-authorization", "proxy-authenticate"}


@dataclass(frozen=True)
class Passing:
    """One request on a link and the receiver's answer (status 0: the receiver was unreachable)."""

    src: str
    dst: str
    method: str
    path: str
    body: bytes
    status: int
    answer: bytes


Hook = Callable[[Passing], "web.Response | None"]
# Awaited before a request is forwarded (src, dst, path, body): it may hold the request back.
Before = Callable[[str, str, str, bytes], Awaitable[None]]


class LinkProxy:
    """Proxies for the directed links of a set of nodes: `port(src, dst)` is where src must
    reach dst; `targets[dst]` is dst's real mesh port."""

    def __init__(self, targets: dict[str, int], hook: Hook | None = None, before: Before | None = None) -> None:
        self.targets = targets
        self.hook = hook
        self.before = before
        links = [(s, d) for s in targets for d in targets if s != d]
        self._ports = dict(zip(links, free_ports(len(links))))
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="link-proxy", daemon=True)
        self._runners: list[web.AppRunner] = []
        self._session: aiohttp.ClientSession | None = None

    def call(self, fn: Callable[[], object]) -> None:
        """Run `fn` on the proxy's loop (to set an asyncio.Event a `before` hook waits on)."""
        self._loop.call_soon_threadsafe(fn)

    def port(self, src: str, dst: str) -> int:
        return self._ports[(src, dst)]

    def peers_arg(self, src: str) -> str:
        """The `--peers` value that routes every link out of `src` through this proxy."""
        return ",".join(f"{dst}@127.0.0.1:{self.port(src, dst)}" for dst in self.targets if dst != src)

    def __enter__(self) -> LinkProxy:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60))
        for (src, dst), port in self._ports.items():
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_route("*", "/{tail:.*}", self._handler(src, dst))
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self._runners.append(runner)

    async def _stop(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _handler(self, src: str, dst: str):
        async def forward(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            if self.before is not None:
                await self.before(src, dst, request.path, body)
            headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
            url = f"http://127.0.0.1:{self.targets[dst]}{request.path_qs}"
            status, answer, answer_headers = 0, b"", {}
            try:
                async with self._session.request(request.method, url, data=body, headers=headers) as resp:
                    status, answer = resp.status, await resp.read()
                    answer_headers = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_BY_HOP}
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                pass
            if self.hook is not None:
                instead = self.hook(Passing(src, dst, request.method, request.path, body, status, answer))
                if instead is not None:
                    return instead
            if status == 0:
                return web.Response(status=502, text="proxy: receiver unreachable")
            return web.Response(status=status, body=answer, headers=answer_headers)

        return forward
