"""Who a signature speaks for: the cluster's two ways to sign, behind one small interface.

* `SharedKey` (the quick start): HMAC-SHA256 with one cluster secret. A valid signature proves
  that *a holder of the secret* signed, so every holder can speak for every node id; the node
  says so in its log when it starts.
* `NodeKey` (per-node identity): each node signs with its own ECDSA P-256 key and sends its
  certificate, issued by the cluster CA (`python -m app.coordination.p2p.tls init`); a signature
  speaks only for the node id its certificate names, so one node's key cannot sign for another.
  With `mesh.tls` the same files are the TLS certificate too; with `mesh.node_keys` they sign
  requests, answers and gossip on a plain-HTTP network.

Both sign bytes and check bytes; what the bytes are (a request, an answer, a gossiped state)
is the callers' business (auth.py, answers.py, membership via node.py).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import hashlib
import hmac
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

from app.config.base import ConfigError
from app.config.mesh import TlsConfig

MAX_CERT_HEADER = 4096  # characters of a base64 certificate in a header


class AuthError(Exception):
    """Why a message was refused; a 401 with this message for a request. `code` is the short
    reason the refusal is counted under in /metrics."""

    def __init__(self, message: str, code: str = "auth") -> None:
        super().__init__(message)
        self.code = code


class Identity(Protocol):
    """Signs as this node, and checks what another node signed."""

    mode: str  # "shared" or "node_keys": every node of a cluster must use the same

    def sign(self, data: bytes) -> tuple[str, str | None]:
        """(signature, certificate to send with it, or None)."""
        ...

    def verify(self, claimed: str, data: bytes, signature: str, cert: str | None) -> None:
        """Raises AuthError unless `signature` over `data` was made for node id `claimed`."""
        ...

    def cert_of(self, node_id: str) -> str | None:
        """The certificate last proven to be `node_id`'s (None: unknown, or no certificates):
        what checks a signature that travels without it (a quorum certificate in gossip)."""
        ...


class SharedKey:
    """HMAC-SHA256 with the cluster secret: proves a holder of the secret signed, not which."""

    mode = "shared"

    def __init__(self, secret: bytes) -> None:
        if not secret:
            raise ValueError("an empty mesh secret")
        self.secret = secret

    def sign(self, data: bytes) -> tuple[str, str | None]:
        return hmac.new(self.secret, data, hashlib.sha256).hexdigest(), None

    def verify(self, claimed: str, data: bytes, signature: str, cert: str | None) -> None:
        if cert is not None:
            raise AuthError("signed with a node key; this cluster signs with its shared secret", "mode")
        expected = hmac.new(self.secret, data, hashlib.sha256).hexdigest()
        if not hmac.compare_digest(expected, signature):
            raise AuthError("bad signature", "signature")

    def cert_of(self, node_id: str) -> str | None:
        return None


class NodeKey:
    """This node's key and certificate, and the cluster CA every other certificate must chain to.
    Verified certificates are cached (bounded) by their text, so a peer's certificate costs one
    CA check, not one per message."""

    mode = "node_keys"

    def __init__(self, files: TlsConfig, cache_size: int = 1024) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        try:
            self.ca = x509.load_pem_x509_certificate(Path(files.ca_file).read_bytes())
            cert = x509.load_pem_x509_certificate(Path(files.cert_file).read_bytes())
            key = serialization.load_pem_private_key(Path(files.key_file).read_bytes(), None)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"node key files ({files.cert_file}, {files.key_file}, {files.ca_file}): {exc}") from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise ConfigError(f"{files.key_file}: expected an EC key from the cluster tool")
        self.key = key
        self.node_id = _common_name(cert) or ""
        self.cert_text = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._cache: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._cache_size = cache_size
        self._known: OrderedDict[str, str] = OrderedDict()  # node id -> its certificate, as last proven
        self._check_cert(self.cert_text)  # our own certificate must chain to the CA we trust

    def sign(self, data: bytes) -> tuple[str, str | None]:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return base64.b64encode(self.key.sign(data, ec.ECDSA(hashes.SHA256()))).decode(), self.cert_text

    def verify(self, claimed: str, data: bytes, signature: str, cert: str | None) -> None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        if not cert:
            raise AuthError("no certificate: this cluster signs with per-node keys (mesh.node_keys or mesh.tls)",
                            "mode")
        named, public_key = self._check_cert(cert)
        if named != claimed:
            raise AuthError(f"signed with the key of {named}, but the message speaks for {claimed}", "identity")
        try:
            public_key.verify(base64.b64decode(signature, validate=True), data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, binascii.Error, ValueError):
            raise AuthError("bad signature", "signature") from None

    def cert_of(self, node_id: str) -> str | None:
        return self._known.get(node_id)

    def _check_cert(self, text: str) -> tuple[str, Any]:
        hit = self._cache.get(text)
        if hit is not None:
            self._cache.move_to_end(text)
            if self._known.get(hit[0]) != text:
                self._remember(hit[0], text)
            return hit
        from cryptography import x509

        if len(text) > MAX_CERT_HEADER:
            raise AuthError("certificate too large", "malformed")
        try:
            cert = x509.load_der_x509_certificate(base64.b64decode(text, validate=True))
            cert.verify_directly_issued_by(self.ca)
        except Exception:  # noqa: BLE001 - any parse or chain failure is the same refusal
            raise AuthError("certificate not issued by this cluster's CA", "certificate") from None
        now = dt.datetime.now(dt.UTC)
        if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
            raise AuthError("certificate expired or not yet valid", "certificate")
        try:
            if cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca:
                raise AuthError("a CA certificate cannot sign as a node", "certificate")
        except x509.ExtensionNotFound:
            pass
        named = _common_name(cert)
        if not named:
            raise AuthError("certificate names no node", "certificate")
        entry = (named, cert.public_key())
        self._cache[text] = entry
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        self._remember(named, text)
        return entry

    def _remember(self, named: str, text: str) -> None:
        self._known[named] = text
        self._known.move_to_end(named)
        while len(self._known) > self._cache_size:
            self._known.popitem(last=False)


def _common_name(cert: Any) -> str | None:
    from cryptography.x509.oid import NameOID

    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else None


def as_identity(key: bytes | str | Identity) -> Identity:
    """A shared secret (bytes or str) becomes a SharedKey; an Identity is itself."""
    if isinstance(key, str):
        key = key.encode()
    if isinstance(key, bytes):
        return SharedKey(key)
    return key
