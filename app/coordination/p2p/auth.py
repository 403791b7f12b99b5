"""HMAC request signing between nodes, and the aiohttp middleware that enforces it.

Signature = HMAC-SHA256(secret, METHOD \\n PATH?QUERY \\n TIMESTAMP \\n NONCE \\n FROM \\n TO \\n BOOT
\\n sha256(body)). FROM and TO are the sender's and the receiver's node ids and BOOT the
receiver's boot incarnation (bumped at every start, persisted): a request captured on its way
to node A is refused by node B (wrong receiver) and by A itself once A has restarted (old boot),
so the in-memory nonce cache only has to cover one boot of one node. A request is accepted
only inside a +-300 s window of a finite timestamp and only once per nonce.

With TLS on (tls.py) the sender's id is the one its certificate names; a request whose FROM
differs from its certificate is refused. Operator endpoints (GET /status, /progress, /mesh/hello,
/metrics) are readable without a signature; everything between nodes must be signed.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
import hmac
import json
import math
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path

from aiohttp import web

from app.config.base import ConfigError

TS_HEADER = "X-Mesh-Timestamp"
NONCE_HEADER = "X-Mesh-Nonce"
SIG_HEADER = "X-Mesh-Signature"
FROM_HEADER = "X-Mesh-From"
TO_HEADER = "X-Mesh-To"
BOOT_HEADER = "X-Mesh-Boot"  # request: the receiver's boot it was signed for; response: the answering node's
NODE_HEADER = "X-Mesh-Node"  # response: the answering node's id
WINDOW_S = 300.0
ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
BODY_KEY = web.RequestKey("mesh_verified_body", bytes)  # the body whose signature was checked
SENDER_KEY = web.RequestKey("mesh_sender", str)  # the node id the signature (or certificate) proves


class AuthError(Exception):
    """Why a request was refused; becomes a 401 with this message. `code` is the short reason
    the refusal is counted under in /metrics."""

    def __init__(self, message: str, code: str = "auth") -> None:
        super().__init__(message)
        self.code = code


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


def canonical(method: str, path_qs: str, timestamp: str, nonce: str, sender: str, receiver: str, boot: str,
              body: bytes) -> bytes:
    digest = hashlib.sha256(body).hexdigest()
    return "\n".join([method.upper(), path_qs, timestamp, nonce, sender, receiver, boot, digest]).encode()


def sign(secret: bytes, method: str, path_qs: str, body: bytes, *, sender: str, receiver: str, boot: int,
         now: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request from `sender` to boot `boot` of node `receiver`."""
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    mac = hmac.new(secret, canonical(method, path_qs, ts, nonce, sender, receiver, str(boot), body), hashlib.sha256)
    return {TS_HEADER: ts, NONCE_HEADER: nonce, SIG_HEADER: mac.hexdigest(), FROM_HEADER: sender,
            TO_HEADER: receiver, BOOT_HEADER: str(boot)}


def skew_reason(skew: float) -> str:
    """`skew` = their timestamp minus our clock, in the words /status shows."""
    return f"clock {abs(skew):.0f} s {'ahead of' if skew > 0 else 'behind'} ours"


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
            raise AuthError("request too old for the replay cache", "replay")
        if nonce in self._seen:
            raise AuthError("replayed nonce", "replay")
        if len(self._seen) >= self.capacity:
            _, evicted_ts = self._seen.popitem(last=False)
            self.floor = max(self.floor, evicted_ts)
            if ts <= self.floor:
                raise AuthError("request too old for the replay cache", "replay")
        self._seen[nonce] = ts


class Verifier:
    """Checks one request addressed to boot `boot` of node `node_id`; returns who sent it."""

    def __init__(self, secret: bytes, node_id: str, boot: int, window: float = WINDOW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.secret = secret
        self.node_id = node_id
        self.boot = boot
        self.window = window
        self.clock = clock
        self.nonces = NonceCache(window)

    def precheck(self, headers: Mapping[str, str], now: float | None = None, cert_id: str | None = None) -> str:
        """Everything that needs no body (so an unsigned or misaddressed request is refused before
        its body is read): the headers are there and well formed, the timestamp is finite and in
        the window, the request is for this node and this boot, the certificate agrees. The
        claimed sender, not yet proven."""
        now = self.clock() if now is None else now
        get = headers.get
        ts, nonce, sig = get(TS_HEADER), get(NONCE_HEADER), get(SIG_HEADER)
        sender, receiver, boot = get(FROM_HEADER), get(TO_HEADER), get(BOOT_HEADER)
        if not ts or not nonce or not sig:
            raise AuthError("unsigned request", "unsigned")
        if not sender or not receiver or boot is None:
            raise AuthError("unsigned request: sender, receiver and boot headers are required", "unsigned")
        if len(nonce) > 128 or len(sig) > 128 or len(ts) > 32 or len(boot) > 20 or not ID_RE.match(sender):
            raise AuthError("malformed signature headers", "malformed")
        try:
            ts_value = float(ts)
        except ValueError:
            raise AuthError("malformed timestamp", "timestamp") from None
        if not math.isfinite(ts_value):
            raise AuthError("malformed timestamp: not a finite number", "timestamp")
        if abs(now - ts_value) > self.window:
            raise AuthError(f"timestamp outside the allowed window: {skew_reason(ts_value - now)}", "clock")
        if receiver != self.node_id:
            raise AuthError(f"addressed to {receiver}, not to {self.node_id}", "receiver")
        if boot != str(self.boot):
            raise AuthError(f"signed for boot {boot} of {self.node_id}; this is boot {self.boot}", "boot")
        if cert_id is not None and cert_id != sender:
            raise AuthError(f"certificate names {cert_id}, the request says {sender}", "identity")
        return sender

    def verify(self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes,
               now: float | None = None, cert_id: str | None = None) -> str:
        """precheck, then the signature over the body, then the nonce; the proven sender."""
        now = self.clock() if now is None else now
        sender = self.precheck(headers, now, cert_id)
        get = headers.get
        ts, nonce = str(get(TS_HEADER)), str(get(NONCE_HEADER))
        expected = hmac.new(self.secret, canonical(method, path_qs, ts, nonce, sender, str(get(TO_HEADER)),
                                                   str(get(BOOT_HEADER)), body), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, str(get(SIG_HEADER))):
            raise AuthError("bad signature", "signature")
        self.nonces.check_and_add(nonce, float(ts), now)
        return sender


def json_error(status: int, message: str, **extra: object) -> web.Response:
    return web.Response(
        status=status,
        text=json.dumps({"error": message, **extra}),
        content_type="application/json",
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
RefusalHook = Callable[[str, str, str], None]  # (peer, code, reason)


class _Trim:
    """Give freed heap back to the OS after large bodies (glibc keeps it otherwise: 40 stalled
    1 MB bodies kept 39 MB after they closed). At most once per `interval` seconds."""

    def __init__(self, interval: float = 5.0) -> None:
        self.interval = interval
        self.last = 0.0
        try:
            self.libc: object | None = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        except OSError:
            self.libc = None

    def __call__(self) -> None:
        now = time.monotonic()
        if self.libc is not None and hasattr(self.libc, "malloc_trim") and now - self.last >= self.interval:
            self.last = now
            self.libc.malloc_trim(0)  # type: ignore[attr-defined]


release_memory = _Trim()
LARGE_BODY = 256 * 1024


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


def _blame(exc: AuthError, claimed: str | None, cert_id: str | None) -> str | None:
    """Whom a refusal is recorded against: the certificate's id, else the sender the request
    claims when it claims a well-formed one (the table is bounded, and /status shows only peers
    it knows, so a forged name buys nothing), else the address."""
    if cert_id is not None:
        return cert_id
    if exc.code in ("unsigned", "malformed", "signature") or not claimed or not ID_RE.match(claimed):
        return None
    return claimed


def auth_middleware(
    verifier: Verifier, max_body_bytes: int, public: Iterable[tuple[str, str]], *,
    body_deadline: float = 10.0, cert_id_of: Callable[[web.Request], str | None] | None = None,
    on_refused: RefusalHook | None = None,
) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """401 for unsigned/tampered/stale/replayed/misaddressed, 413 for oversized bodies, 408 for
    a body that does not arrive within `body_deadline`; the verified body and the proven sender
    are left in request[BODY_KEY] and request[SENDER_KEY] for handlers."""
    public_set = {(m.upper(), p) for m, p in public}

    def refuse(request: web.Request, status: int, code: str, message: str, peer: str | None = None) -> web.Response:
        if on_refused is not None:
            on_refused(peer or request.remote or "?", code, message)
        resp = json_error(status, message, code=code)
        if status in (408, 413):
            resp.force_close()  # the rest of that body is not worth reading
            release_memory()
        return resp

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (request.method, request.path) in public_set:
            return await handler(request)
        if request.content_length is not None and request.content_length > max_body_bytes:
            return refuse(request, 413, "too_large", f"body larger than {max_body_bytes} bytes")
        cert_id = cert_id_of(request) if cert_id_of is not None else None
        try:
            claimed = verifier.precheck(request.headers, cert_id=cert_id)
        except AuthError as exc:  # refused before reading a byte of the body
            resp = refuse(request, 401, exc.code, str(exc), _blame(exc, request.headers.get(FROM_HEADER), cert_id))
            resp.force_close()
            return resp
        try:
            body = await asyncio.wait_for(read_body(request, max_body_bytes), body_deadline)
        except TimeoutError:
            return refuse(request, 408, "slow_body", f"body not received within {body_deadline:g} s", claimed)
        except Exception as exc:  # noqa: BLE001 - a broken stream is the client's problem
            return refuse(request, 400, "bad_body", f"cannot read body: {exc}", claimed)
        if body is None:
            return refuse(request, 413, "too_large", f"body larger than {max_body_bytes} bytes", claimed)
        try:
            sender = verifier.verify(request.method, request.path_qs, request.headers, body, cert_id=cert_id)
        except AuthError as exc:
            return refuse(request, 401, exc.code, str(exc), _blame(exc, claimed, cert_id))
        request[BODY_KEY] = body
        request[SENDER_KEY] = sender
        try:
            return await handler(request)
        finally:
            if len(body) >= LARGE_BODY or (request.content_length or 0) >= LARGE_BODY:
                del body
                request[BODY_KEY] = b""
                release_memory()

    return middleware
