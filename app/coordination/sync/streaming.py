"""Pulling a file by content hash from peers: the signed, bounded, fsynced download and the
errors both model and dataset fetches report. The callers verify and install; this only moves
bytes and says exactly what went wrong with which peer."""

from __future__ import annotations

import asyncio
import hashlib
import os
import secrets
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp

from app.coordination.p2p.client import MeshClient
from app.log import get_logger

log = get_logger(__name__)
T = TypeVar("T")

CHUNK = 1 << 20
TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class PeerFailed(Exception):
    """This peer's copy is refused (the message says why); the next peer is asked."""


class FetchError(RuntimeError):
    """No peer served a verified copy; names what, its sha256 and every peer's failure."""

    def __init__(self, what: str, sha256: str, failures: dict[str, str], nobody: str) -> None:
        self.sha256 = sha256
        self.failures = failures
        detail = "; ".join(f"{peer}: {why}" for peer, why in failures.items()) or nobody
        super().__init__(f"{what} {sha256}: no verified copy fetched ({detail})")


def stream_timeout(timeout: float) -> aiohttp.ClientTimeout:
    """`timeout` bounds connecting and each read (a stalled peer), not the whole transfer, so a
    large file on a slow link still arrives."""
    return aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)


async def download(client: MeshClient, session: aiohttp.ClientSession, addr: str, path: str,
                   dest: Path, max_bytes: int, label: str) -> tuple[int, str]:
    """Signed GET of `path` from `addr` into `dest`, fsynced: (bytes, sha256 hex). Refuses a
    non-200 answer, more than `max_bytes`, and fewer bytes than a Content-Length promised."""
    async with session.get(client.url(addr, path), headers=await client.signed_headers(addr, "GET", path)) as resp:
        if resp.status != 200:
            raise PeerFailed(f"{label}: HTTP {resp.status}")
        if resp.content_length is not None and resp.content_length > max_bytes:
            raise PeerFailed(f"{label}: {resp.content_length} bytes is over the {max_bytes} limit")
        digest = hashlib.sha256()
        size = 0
        with open(dest, "wb") as fh:
            async for chunk in resp.content.iter_chunked(CHUNK):
                size += len(chunk)
                if size > max_bytes:
                    raise PeerFailed(f"{label}: more than {max_bytes} bytes")
                digest.update(chunk)
                fh.write(chunk)
            if resp.content_length is not None and size != resp.content_length:
                raise PeerFailed(f"{label} truncated: {size} of {resp.content_length} bytes")
            fh.flush()
            os.fsync(fh.fileno())
    return size, digest.hexdigest()


async def first_verified_copy(
    what: str, sha256: str, peer_addrs: list[str], root: Path, timeout: float,
    fetch: Callable[[aiohttp.ClientSession, str, Path], Awaitable[T]], client: MeshClient,
) -> tuple[T | None, dict[str, str]]:
    """Ask each peer in turn: `fetch(session, addr, staging)` downloads into a fresh staging dir
    under `root`, verifies and installs, or raises PeerFailed. (its result, {}) for the first
    peer that works, else (None, every peer's failure). Staging dirs never outlive a try.
    The session speaks TLS with the mesh client's certificate when the mesh does, and believes
    only answers the peer signed (client.answer_middleware: a peer's refused answer is that
    peer's failure; the bytes themselves are checked against the sha256 by `fetch`)."""
    sweep_staging(root)
    failures: dict[str, str] = {}
    connector = aiohttp.TCPConnector(ssl=client.ssl_context or True)
    async with aiohttp.ClientSession(timeout=stream_timeout(timeout), connector=connector,
                                     middlewares=(client.answer_middleware(),)) as session:
        for addr in peer_addrs:
            staging = root / f".fetch-{sha256[:16]}-{secrets.token_hex(4)}"
            try:
                staging.mkdir()
                result = await fetch(session, addr, staging)
                log.info(f"{what} fetched", sha256=sha256, peer=addr)
                return result, {}
            except PeerFailed as exc:
                failures[addr] = str(exc)
            except TRANSPORT_ERRORS as exc:  # AnswerRefused (an unsigned or forged answer) is one
                failures[addr] = f"transfer failed: {exc!r}"
            finally:
                shutil.rmtree(staging, ignore_errors=True)
            log.warning(f"{what} fetch from peer rejected", sha256=sha256, peer=addr, reason=failures[addr])
    return None, failures


def sweep_staging(root: Path, max_age_s: float = 3600.0) -> None:
    """Staging dirs left by a process killed mid-download; never read, only removed."""
    for stale in root.glob(".fetch-*"):
        try:
            if time.time() - stale.stat().st_mtime > max_age_s:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
