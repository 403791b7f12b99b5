"""Signed answers: what a node says back is as authenticated as what it was asked.

An answer that changes what the caller believes (a term, a vote, gossip, a claim, games, a
model) is only worth something if the node that was asked gave it: otherwise whatever answers
at a peer's address could hand out terms or game data. So a node signs every answer to a
request that carried a nonce (every request our client makes, signed or public):

    mesh-answer / METHOD / PATH / STATUS / REQUEST NONCE / ANSWERING NODE / ASKING NODE / ANSWERING BOOT /
    TIMESTAMP / DIGEST

one per line, in X-Mesh-Signature (with X-Mesh-Cert under per-node keys), the answering node in
X-Mesh-Node, its boot in X-Mesh-Boot, the asker in X-Mesh-To, the time in X-Mesh-Timestamp and
the body's sha256 in X-Mesh-Content-Sha256. The request's nonce binds the answer to one request,
so an old answer cannot be replayed to a new one, and the request's method and path (without
its query) bind it to what was asked: a public endpoint answers whoever names an asker and a
nonce, so without them a signed answer to `GET /status` could be passed off as the answer to
another request that carried the same nonce. That, not the answering node's clock, makes
an answer fresh (a node whose clock is off still gets its peers' answers, and learns from
them why its own requests are refused). A streamed body (a model file, a dataset) is
not hashed before it is sent: its digest is STREAMED and the caller checks the content against
the sha256 it asked for, as it always has.

The caller (client.py) refuses an answer that is unsigned, signed by another node than the
one it asked, for another asker, stale, or whose body does not hash to the signed digest. The
one exception is an unsigned refusal (400, 401, 408, 413): a node cannot sign an answer to a
request it could not authenticate, and a refusal changes no belief.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from app.coordination.p2p.auth import (
    BOOT_HEADER,
    CERT_HEADER,
    DIGEST_HEADER,
    HEX64,
    NODE_HEADER,
    SIG_HEADER,
    TO_HEADER,
    TS_HEADER,
    fresh,
)
from app.coordination.p2p.identity import AuthError, Identity

STREAMED = "STREAMED"
UNSIGNED_REFUSALS = (400, 401, 408, 413)


def answer_text(method: str, path: str, status: int, nonce: str, answerer: str, asker: str, boot: str,
                timestamp: str, digest: str) -> bytes:
    return "\n".join(["mesh-answer", method.upper(), path, str(status), nonce, answerer, asker, boot, timestamp,
                      digest]).encode()


def answer_headers(identity: Identity, answerer: str, boot: int, asker: str, nonce: str, status: int,
                   body: bytes | None, now: float, *, method: str, path: str) -> dict[str, str]:
    """Headers that sign one answer to `method` `path` (no query); `body` None for a streamed body."""
    ts = f"{now:.3f}"
    digest = STREAMED if body is None else hashlib.sha256(body).hexdigest()
    signature, cert = identity.sign(answer_text(method, path, status, nonce, answerer, asker, str(boot), ts, digest))
    headers = {NODE_HEADER: answerer, BOOT_HEADER: str(boot), TO_HEADER: asker, TS_HEADER: ts,
               DIGEST_HEADER: digest, SIG_HEADER: signature}
    if cert is not None:
        headers[CERT_HEADER] = cert
    return headers


def check_answer(identity: Identity, *, asker: str, expected: str | None, nonce: str, status: int,
                 headers: Mapping[str, str], body: bytes | None, method: str, path: str) -> str:
    """The answering node's id, once the answer is proven to be its answer to this request;
    AuthError otherwise. `expected`: the node the request was signed for (None: whoever answers,
    e.g. the first question to an address). `body` None: not read yet. A STREAMED answer (a file
    the node sent as it read it) proves who answered; its bytes are content-addressed, and the
    caller checks them against the sha256 it asked for."""
    get = headers.get
    answerer, sig, digest = get(NODE_HEADER), get(SIG_HEADER), get(DIGEST_HEADER)
    if not answerer or not sig or not digest:
        raise AuthError(f"unsigned answer (HTTP {status})", "answer_unsigned")
    if expected is not None and answerer != expected:
        raise AuthError(f"answered by {answerer}, not by {expected}", "answer_node")
    if get(TO_HEADER) != asker:
        raise AuthError(f"an answer for {get(TO_HEADER)}, not for {asker}", "answer_asker")
    ts = get(TS_HEADER)
    try:  # only well formed: the request's fresh nonce, not the clock, makes an answer fresh
        fresh(ts, 0.0, float("inf"))
    except AuthError as exc:
        raise AuthError(f"answer {exc}", "answer_malformed") from None
    if digest != STREAMED:
        if not HEX64.match(digest):
            raise AuthError("malformed answer digest", "answer_digest")
        if body is not None and hashlib.sha256(body).hexdigest() != digest:
            raise AuthError("the answer's body does not match its signed digest", "answer_digest")
    try:
        identity.verify(answerer, answer_text(method, path, status, nonce, answerer, asker, str(get(BOOT_HEADER)),
                                              str(ts), digest), sig, get(CERT_HEADER))
    except AuthError as exc:
        raise AuthError(f"answer: {exc}", f"answer_{exc.code}") from None
    return answerer
