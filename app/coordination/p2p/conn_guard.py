"""Slow and many clients: caps on open connections (per address and in all) and a deadline for
a request's headers, on the aiohttp server's connection hooks.

A client that sends a byte a second must not hold a descriptor forever, and a thousand of them
must not starve `/status`. So a connection has `header_deadline` seconds (after it opens, or
after its previous answer) to deliver a request's headers; and when a cap is reached, the
oldest connection that is still waiting for headers is closed to make room (slow clients lose,
a client that asks at once wins). Only when every connection at the cap is busy serving a
request is the new one refused. A request's whole signature is checked before its body is read
(auth_middleware), so a connection that cannot sign is never busy for long: it is answered 401
and closed, and what it buffered (at most `mesh.limits.read_bufsize`, twice) is freed with it.
Bodies have their own deadline.

Errors the event loop reports on its own (e.g. `accept` failing with "Too many open files"
under a flood) are logged at a bounded rate (`rate_limit_loop_errors`), not once per attempt.
"""

from __future__ import annotations

import asyncio
import resource
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web

from app.coordination.p2p.refusals import RateLimitedLog

RefusalHook = Callable[[str, str, str], None]  # (peer, code, reason)


@dataclass
class _Conn:
    addr: str
    busy: int = 0  # requests being served
    timer: asyncio.TimerHandle | None = field(default=None, repr=False)


class ConnectionGuard:
    def __init__(self, per_addr: int, total: int, header_deadline: float,
                 on_refused: RefusalHook | None = None) -> None:
        self.per_addr = per_addr
        self.total = total
        self.header_deadline = header_deadline
        self.on_refused = on_refused
        self.conns: OrderedDict[asyncio.BaseTransport, _Conn] = OrderedDict()  # oldest first
        self.by_addr: dict[str, int] = {}

    def install(self, server: web.Server) -> None:
        """Hook the aiohttp server's connection callbacks (after AppRunner.setup())."""
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler, transport) -> None:  # type: ignore[no-untyped-def]
            made(handler, transport)
            self.opened(transport)

        def connection_lost(handler, exc) -> None:  # type: ignore[no-untyped-def]
            self.closed(handler.transport)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    # -- connection events -------------------------------------------------------------
    def opened(self, transport: asyncio.BaseTransport) -> None:
        peer = transport.get_extra_info("peername")
        addr = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if self.by_addr.get(addr, 0) >= self.per_addr and not self._evict(addr):
            self._refuse(transport, addr, f"{self.per_addr} connections from {addr} are busy")
            return
        if len(self.conns) >= self.total and not self._evict(None):
            self._refuse(transport, addr, f"{self.total} connections are busy")
            return
        conn = _Conn(addr)
        self.conns[transport] = conn
        self.by_addr[addr] = self.by_addr.get(addr, 0) + 1
        self._arm(transport, conn)

    def closed(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self.conns.pop(transport, None) if transport is not None else None
        if conn is None:
            return
        if conn.timer is not None:
            conn.timer.cancel()
        left = self.by_addr.get(conn.addr, 1) - 1
        if left > 0:
            self.by_addr[conn.addr] = left
        else:
            self.by_addr.pop(conn.addr, None)

    def request_started(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self.conns.get(transport) if transport is not None else None
        if conn is not None:
            conn.busy += 1
            if conn.timer is not None:
                conn.timer.cancel()
                conn.timer = None

    def request_done(self, transport: asyncio.BaseTransport | None) -> None:
        conn = self.conns.get(transport) if transport is not None else None
        if conn is not None:
            conn.busy = max(0, conn.busy - 1)
            if conn.busy == 0:
                self._arm(transport, conn)  # type: ignore[arg-type]

    # -- internals ---------------------------------------------------------------------
    def _arm(self, transport: asyncio.BaseTransport, conn: _Conn) -> None:
        if conn.timer is not None:
            conn.timer.cancel()
        loop = asyncio.get_running_loop()
        conn.timer = loop.call_later(self.header_deadline, self._expire, transport)

    def _expire(self, transport: asyncio.BaseTransport) -> None:
        conn = self.conns.get(transport)
        if conn is not None and conn.busy == 0:
            self._drop(transport, conn.addr, "slow_headers", f"no request within {self.header_deadline:g} s")

    def _evict(self, addr: str | None) -> bool:
        """Close the oldest connection still waiting for headers (from `addr`, or any)."""
        for transport, conn in self.conns.items():
            if conn.busy == 0 and (addr is None or conn.addr == addr):
                self._drop(transport, conn.addr, "evicted", "closed to make room: it sent no request")
                return True
        return False

    def _drop(self, transport: asyncio.BaseTransport, addr: str, code: str, reason: str) -> None:
        self.closed(transport)
        transport.abort()  # type: ignore[attr-defined]
        if self.on_refused is not None:
            self.on_refused(addr, code, reason)

    def _refuse(self, transport: asyncio.BaseTransport, addr: str, reason: str) -> None:
        transport.abort()  # type: ignore[attr-defined]
        if self.on_refused is not None:
            self.on_refused(addr, "too_many_connections", reason)

    def middleware(self):  # type: ignore[no-untyped-def]
        """Marks a connection busy while a request is served (its header deadline pauses)."""

        @web.middleware
        async def mark_busy(request: web.Request, handler):  # type: ignore[no-untyped-def]
            transport = request.transport
            self.request_started(transport)
            try:
                return await handler(request)
            finally:
                self.request_done(transport)

        return mark_busy


def rate_limit_loop_errors(loop: asyncio.AbstractEventLoop, interval: float = 10.0) -> None:
    """Errors the loop reports itself (a failing `accept` under a descriptor flood was logged
    ~14,000 times in 20 s) at most once per `interval` per message, with the count left out.
    A handler someone else installed is left alone."""
    if loop.get_exception_handler() is not None:
        return
    limited = RateLimitedLog(interval)

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        message = str(context.get("message", "event loop error"))
        exc = context.get("exception")
        if limited.emit(f"loop:{message}", "event_loop_error", message=message[:200],
                        error=repr(exc)[:200] if exc is not None else None):
            loop.default_exception_handler(context)  # the traceback, at the same bounded rate

    loop.set_exception_handler(handler)


def raise_descriptor_limit() -> None:
    """Soft descriptor limit up to the hard one (at most 65,536): a connection flood meets the
    connection caps above long before `accept` fails with "Too many open files"."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = 1 << 16 if hard == resource.RLIM_INFINITY else min(hard, 1 << 16)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ValueError, OSError):
        pass
