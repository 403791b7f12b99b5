"""HMAC request signing between nodes, and the aiohttp middleware that enforces it.

Signature = HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n sha256(body)).
A request is accepted only inside a +-300 s window and only once per nonce, so a captured
request cannot be replayed. Operator endpoints (GET /status, GET /progress) are readable
without a signature; everything between nodes must be signed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from aiohttp import web

from app.config.base import ConfigError

TS_HEADER = "X-Mesh-Timestamp"
NONCE_HEADER = "X-Mesh-Nonce"
SIG_HEADER = "X-Mesh-Signature"
WINDOW_S = 300.0
BODY_KEY = web.RequestKey("mesh_verified_body", bytes)  # the body whose signature was checked


class AuthError(Exception):
    """Why a request was refused; becomes a 401 with this message."""


def load_secret(
    config_secret: str | None = None,
    config_secret_file: Path | None = None,
    data_dir: Path | None = None,
    allow_generate: bool = False,
) -> bytes:
    """Env MESH_SECRET, env MESH_SECRET_FILE, config secret, config secret_file, in that order.

    A lone node (no peers) may generate one into its data dir; a cluster must share one.
    """
    env = os.environ.get("MESH_SECRET")
    if env:
        return env.encode()
    env_file = os.environ.get("MESH_SECRET_FILE")
    if env_file:
        return _read_secret_file(Path(env_file))
    if config_secret:
        return config_secret.encode()
    if config_secret_file is not None:
        return _read_secret_file(config_secret_file)
    if allow_generate and data_dir is not None:
        path = data_dir / "mesh_secret"
        if not path.exists():
            data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        return _read_secret_file(path)
    raise ConfigError(
        "no mesh secret: set MESH_SECRET or MESH_SECRET_FILE (or mesh.secret_file in the config)"
    )


def _read_secret_file(path: Path) -> bytes:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read mesh secret: {exc}") from None
    if not value:
        raise ConfigError(f"{path}: mesh secret file is empty")
    return value.encode()


def canonical(method: str, path_qs: str, timestamp: str, nonce: str, body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([method.upper(), path_qs, timestamp, nonce, digest]).encode()


def sign(secret: bytes, method: str, path_qs: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request."""
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    mac = hmac.new(secret, canonical(method, path_qs, ts, nonce, body), hashlib.sha256)
    return {TS_HEADER: ts, NONCE_HEADER: nonce, SIG_HEADER: mac.hexdigest()}


class NonceCache:
    """Nonces seen inside the window. When full, the oldest are evicted and the window's
    lower edge moves up past them, so an evicted nonce can never be replayed."""

    def __init__(self, window: float = WINDOW_S, capacity: int = 200_000) -> None:
        self.window = window
        self.capacity = capacity
        self._seen: OrderedDict[str, float] = OrderedDict()
        self.floor = float("-inf")

    def check_and_add(self, nonce: str, ts: float, now: float) -> None:
        while self._seen:  # entries outside the window are refused by the window check anyway
            oldest_ts = next(iter(self._seen.values()))
            if oldest_ts >= now - self.window:
                break
            self._seen.popitem(last=False)
        if ts <= self.floor:
            raise AuthError("request too old for the replay cache")
        if nonce in self._seen:
            raise AuthError("replayed nonce")
        if len(self._seen) >= self.capacity:
            _, evicted_ts = self._seen.popitem(last=False)
            self.floor = max(self.floor, evicted_ts)
            if ts <= self.floor:
                raise AuthError("request too old for the replay cache")
        self._seen[nonce] = ts


class Verifier:
    def __init__(self, secret: bytes, window: float = WINDOW_S) -> None:
        self.secret = secret
        self.window = window
        self.nonces = NonceCache(window)

    def verify(
        self, method: str, path_qs: str, headers: dict[str, str] | object, body: bytes, now: float | None = None
    ) -> None:
        now = time.time() if now is None else now
        get = headers.get  # type: ignore[attr-defined]
        ts, nonce, sig = get(TS_HEADER), get(NONCE_HEADER), get(SIG_HEADER)
        if not ts or not nonce or not sig:
            raise AuthError("unsigned request")
        if len(nonce) > 128 or len(sig) > 128:
            raise AuthError("malformed signature headers")
        try:
            ts_value = float(ts)
        except ValueError:
            raise AuthError("malformed timestamp") from None
        if abs(now - ts_value) > self.window:
            raise AuthError("timestamp outside the allowed window")
        expected = hmac.new(
            self.secret, canonical(method, path_qs, ts, nonce, body), hashlib.sha256
        ).hexdigest()
        if not hmac.compare_digest(expected, sig):
            raise AuthError("bad signature")
        self.nonces.check_and_add(nonce, ts_value, now)


def json_error(status: int, message: str, **extra: object) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": message, **extra}),
        content_type="application/json",
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def read_body(request: web.Request, max_body_bytes: int) -> bytes | None:
    """The whole body, or None once it passes `max_body_bytes`. One `read(n)` is not enough:
    it returns what has arrived so far, and a large body arrives in several chunks."""
    chunks: list[bytes] = []
    total = 0
    while chunk := await request.content.readany():
        total += len(chunk)
        if total > max_body_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def auth_middleware(
    verifier: Verifier, max_body_bytes: int, public: Iterable[tuple[str, str]]
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """401 for unsigned/tampered/stale/replayed, 413 for oversized bodies; the verified body
    is left in request[BODY_KEY] for handlers."""
    public_set = {(m.upper(), p) for m, p in public}

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (request.method, request.path) in public_set:
            return await handler(request)
        if request.content_length is not None and request.content_length > max_body_bytes:
            return json_error(413, f"body larger than {max_body_bytes} bytes")
        try:
            body = await read_body(request, max_body_bytes)
        except Exception as exc:  # noqa: BLE001 - a broken stream is the client's problem
            return json_error(400, f"cannot read body: {exc}")
        if body is None:
            return json_error(413, f"body larger than {max_body_bytes} bytes")
        try:
            verifier.verify(request.method, request.path_qs, request.headers, body)
        except AuthError as exc:
            return json_error(401, str(exc))
        request[BODY_KEY] = body
        return await handler(request)

    return middleware
