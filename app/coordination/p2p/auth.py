"""Request signing between nodes, and the aiohttp middleware that enforces it.

A request carries X-Mesh-Timestamp, -Nonce, -From, -To, -Boot, -Content-Sha256 and -Signature
(plus -Cert with per-node keys: identity.py). The signature covers

    mesh-request / METHOD / PATH?QUERY / TIMESTAMP / NONCE / FROM / TO / BOOT / sha256(body)

one per line. FROM and TO are the sender's and the receiver's node ids and BOOT the receiver's
boot incarnation (bumped at every start, persisted): a request captured on its way to node A is
refused by node B (wrong receiver) and by A itself once A has restarted (old boot), so the
in-memory nonce cache only has to cover one boot of one node. The body's digest is a header, so
the whole signature is checked before one byte of the body is read: without the secret (or a
node key) nothing gets a body buffered. The body read afterwards must hash to the signed digest.
A request is accepted only inside a window of seconds (`mesh.limits.clock_window_s`) around a
finite signed timestamp, and only once per nonce.

With TLS on (tls.py) the sender's id is also the one its certificate names; a request whose FROM
differs from its certificate is refused. Operator endpoints (GET /status, /progress, /mesh/hello,
/metrics) are readable without a signature; everything between nodes must be signed. Answers
are signed too (answers.py).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import hashlib
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
from app.config.mesh import MeshConfig
from app.coordination.p2p.identity import AuthError, Identity, NodeKey, SharedKey, as_identity
from app.coordination.p2p.jsonwire import dumps

TS_HEADER = "X-Mesh-Timestamp"
NONCE_HEADER = "X-Mesh-Nonce"
SIG_HEADER = "X-Mesh-Signature"
FROM_HEADER = "X-Mesh-From"
TO_HEADER = "X-Mesh-To"  # request: the receiver; answer: the node that asked
BOOT_HEADER = "X-Mesh-Boot"  # request: the receiver's boot it was signed for; answer: the answering node's
NODE_HEADER = "X-Mesh-Node"  # answer: the answering node's id
DIGEST_HEADER = "X-Mesh-Content-Sha256"  # sha256 hex of the body (answers: or STREAMED)
CERT_HEADER = "X-Mesh-Cert"  # per-node keys: the signer's certificate, base64 DER
WINDOW_S = 10.0
ID_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
HEX64 = re.compile(r"^[0-9a-f]{64}$")
BODY_KEY = web.RequestKey("mesh_verified_body", bytes)  # the body whose signature was checked
SENDER_KEY = web.RequestKey("mesh_sender", str)  # the node id the signature (or certificate) proves

__all__ = ["AuthError", "Identity"]  # re-exported: the refusal type of every check


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


def load_identity(mesh: MeshConfig, secret: bytes | str | None = None, data_dir: Path | None = None,
                  allow_generate: bool = False) -> Identity:
    """Who this process signs as: its own key when `mesh.node_keys` or `mesh.tls` names one (a
    node, or an operator with a certificate from the cluster tool), else the shared secret
    (`secret`, then load_secret's sources)."""
    files = mesh.key_files()
    if files is not None:
        return NodeKey(files)
    if isinstance(secret, str):
        secret = secret.encode()
    return SharedKey(secret or load_secret(mesh.secret, mesh.secret_file, data_dir, allow_generate))


def _read_secret_file(path: Path) -> bytes:
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read mesh secret: {exc}") from None
    if not value:
        raise ConfigError(f"{path}: mesh secret file is empty")
    return value.encode()


def request_text(method: str, path_qs: str, timestamp: str, nonce: str, sender: str, receiver: str, boot: str,
                 digest: str) -> bytes:
    """The bytes a request's signature covers (the module docstring says why each is there)."""
    return "\n".join(["mesh-request", method.upper(), path_qs, timestamp, nonce, sender, receiver, boot,
                      digest]).encode()


def sign(key: bytes | str | Identity, method: str, path_qs: str, body: bytes, *, sender: str, receiver: str,
         boot: int, now: float | None = None) -> dict[str, str]:
    """Headers that authenticate one request from `sender` to boot `boot` of node `receiver`.
    `key`: the cluster secret, or an Identity (a node key signs only as the node it names)."""
    identity = as_identity(key)
    ts = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    digest = hashlib.sha256(body).hexdigest()
    signature, cert = identity.sign(request_text(method, path_qs, ts, nonce, sender, receiver, str(boot), digest))
    headers = {TS_HEADER: ts, NONCE_HEADER: nonce, SIG_HEADER: signature, FROM_HEADER: sender,
               TO_HEADER: receiver, BOOT_HEADER: str(boot), DIGEST_HEADER: digest}
    if cert is not None:
        headers[CERT_HEADER] = cert
    return headers


def fresh(ts: str | None, now: float, window: float) -> float:
    """The signed timestamp as a number, if it is finite and within `window` s of `now`."""
    if not ts or len(ts) > 32:
        raise AuthError("malformed timestamp", "timestamp")
    try:
        value = float(ts)
    except ValueError:
        raise AuthError("malformed timestamp", "timestamp") from None
    if not math.isfinite(value):
        raise AuthError("malformed timestamp: not a finite number", "timestamp")
    if abs(now - value) > window:
        raise AuthError(f"timestamp outside the allowed window of {window:g} s: {skew_reason(value - now)}", "clock")
    return value


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

    def __init__(self, key: bytes | str | Identity, node_id: str, boot: int, window: float = WINDOW_S,
                 clock: Callable[[], float] = time.time) -> None:
        self.identity = as_identity(key)
        self.node_id = node_id
        self.boot = boot
        self.window = window
        self.clock = clock
        self.nonces = NonceCache(window)

    def check_headers(self, method: str, path_qs: str, headers: Mapping[str, str], now: float | None = None,
                      cert_id: str | None = None) -> str:
        """Everything but the body, the signature included, so nothing unproven gets its body
        read: the headers are there and well formed, the timestamp is finite and in the window,
        the request is for this node and this boot, the certificate agrees, the signature over
        the headers (and the body's signed digest) is good, the nonce is new. The proven sender."""
        now = self.clock() if now is None else now
        get = headers.get
        ts, nonce, sig = get(TS_HEADER), get(NONCE_HEADER), get(SIG_HEADER)
        sender, receiver, boot, digest = get(FROM_HEADER), get(TO_HEADER), get(BOOT_HEADER), get(DIGEST_HEADER)
        if not ts or not nonce or not sig:
            raise AuthError("unsigned request", "unsigned")
        if not sender or not receiver or boot is None or digest is None:
            raise AuthError("unsigned request: sender, receiver, boot and body digest headers are required",
                            "unsigned")
        if len(nonce) > 128 or len(sig) > 256 or len(boot) > 20 or not ID_RE.match(sender) \
                or not HEX64.match(digest):
            raise AuthError("malformed signature headers", "malformed")
        ts_value = fresh(ts, now, self.window)
        if receiver != self.node_id:
            raise AuthError(f"addressed to {receiver}, not to {self.node_id}", "receiver")
        if boot != str(self.boot):
            raise AuthError(f"signed for boot {boot} of {self.node_id}; this is boot {self.boot}", "boot")
        if cert_id is not None and cert_id != sender:
            raise AuthError(f"certificate names {cert_id}, the request says {sender}", "identity")
        self.identity.verify(sender, request_text(method, path_qs, ts, nonce, sender, receiver, boot, digest),
                             sig, get(CERT_HEADER))
        self.nonces.check_and_add(nonce, ts_value, now)
        return sender

    @staticmethod
    def check_body(headers: Mapping[str, str], body: bytes) -> None:
        if hashlib.sha256(body).hexdigest() != headers.get(DIGEST_HEADER):
            raise AuthError("the body does not match its signed digest", "digest")

    def verify(self, method: str, path_qs: str, headers: Mapping[str, str], body: bytes,
               now: float | None = None, cert_id: str | None = None) -> str:
        """check_headers, then the body against its signed digest; the proven sender."""
        sender = self.check_headers(method, path_qs, headers, now, cert_id)
        self.check_body(headers, body)
        return sender


def json_error(status: int, message: str, **extra: object) -> web.Response:
    return web.Response(status=status, text=dumps({"error": message, **extra}), content_type="application/json")


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
    if exc.code in ("unsigned", "malformed", "signature", "mode", "certificate", "identity") or not claimed \
            or not ID_RE.match(claimed):
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
            resp = refuse(request, 413, "too_large", f"body larger than {max_body_bytes} bytes")
            return resp
        cert_id = cert_id_of(request) if cert_id_of is not None else None
        try:  # the whole signature, before a byte of the body is read
            sender = verifier.check_headers(request.method, request.path_qs, request.headers, cert_id=cert_id)
        except AuthError as exc:
            resp = refuse(request, 401, exc.code, str(exc), _blame(exc, request.headers.get(FROM_HEADER), cert_id))
            resp.force_close()
            return resp
        try:
            body = await asyncio.wait_for(read_body(request, max_body_bytes), body_deadline)
        except TimeoutError:
            return refuse(request, 408, "slow_body", f"body not received within {body_deadline:g} s", sender)
        except Exception as exc:  # noqa: BLE001 - a broken stream is the client's problem
            return refuse(request, 400, "bad_body", f"cannot read body: {exc}", sender)
        if body is None:
            return refuse(request, 413, "too_large", f"body larger than {max_body_bytes} bytes", sender)
        try:
            verifier.check_body(request.headers, body)
        except AuthError as exc:
            resp = refuse(request, 401, exc.code, str(exc), sender)
            resp.force_close()
            return resp
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
