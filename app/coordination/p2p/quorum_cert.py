"""Quorum certificates: the proof that a majority of the configured voters agreed.

Raft and Paxos assume no member lies; with per-node keys this cluster can do better at little
cost. Two things are decided, and each carries the signatures of floor(V/2)+1 voters:

* a leader's authority: every voter that grants a (real, not pre-) vote signs
  `mesh-vote / TERM / CANDIDATE`; the candidate that wins gathers them into an *election
  certificate*, sent with its messages, and no node follows a leader of a new term (adopts its
  term, stores its values) without checking it;
* a decided value: every voter that stores (key, value) in phase 2 signs
  `mesh-ack / TERM / KEY / sha256(VALUE)`; the leader's *decision certificate* goes with
  `/commit/decided` and with the value in gossip, and a node stores or applies a decided value
  only with one.

So one compromised member, even a voter, cannot make a decision on its own: it holds one
signature, and a certificate needs a majority. Under the shared secret (the quick start) every
holder can make every signature: certificates are built and checked the same way, and protect
nothing against a member (`/status` says so).

The rules here are pure: the texts signed, and `certificate_refusal`, given a function that
checks one signature (identity.py's, at the edge).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

from app.coordination.p2p.election import quorum_size
from app.coordination.p2p.identity import AuthError, Identity
from app.coordination.p2p.schemas import Kind, QuorumCert, VoterSignature

VerifyOne = Callable[[str, bytes, str, str | None], bool]  # (voter, text, signature, certificate) -> valid


def value_digest(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def vote_text(term: int, candidate: str) -> bytes:
    return f"mesh-vote\n{term}\n{candidate}".encode()


def ack_text(term: int, key: str, digest: str) -> bytes:
    return f"mesh-ack\n{term}\n{key}\n{digest}".encode()


def signed_text(cert: QuorumCert) -> bytes:
    return vote_text(cert.term, cert.subject) if cert.kind == "vote" else ack_text(cert.term, cert.subject, cert.digest)


def valid_signers(cert: QuorumCert, voters: Iterable[str], verify: VerifyOne, enough: int | None = None) -> set[str]:
    """The configured voters whose signature in `cert` checks (each counted once); checking
    stops once `enough` did (a signature costs a public-key operation)."""
    voter_set = set(voters)
    text = signed_text(cert)
    ok: set[str] = set()
    for entry in cert.sigs:
        if enough is not None and len(ok) >= enough:
            break
        if entry.voter in voter_set and entry.voter not in ok and verify(entry.voter, text, entry.sig, entry.cert):
            ok.add(entry.voter)
    return ok


def certificate_refusal(cert: QuorumCert | None, voters: Iterable[str], verify: VerifyOne, *, kind: Kind,
                        term: int | None, subject: str, digest: str = "") -> str | None:
    """Why `cert` does not prove that a quorum of `voters` agreed to (kind, term, subject,
    digest), or None when it does. `term` None: any term (a decided value is decided for good,
    whatever the term of the leader that had it stored)."""
    if cert is None:
        return f"no {kind} certificate"
    if cert.kind != kind:
        return f"a {cert.kind} certificate where a {kind} certificate is needed"
    if term is not None and cert.term != term:
        return f"certificate of term {cert.term}, not {term}"
    if cert.subject != subject or cert.digest != digest:
        return f"certificate for {cert.subject[:64]}, not for {subject[:64]}" if cert.subject != subject \
            else "certificate for another value"
    voter_set = set(voters)
    need = quorum_size(voter_set)
    signers = valid_signers(cert, voter_set, verify, enough=need)
    if len(signers) < need:
        return f"{len(signers)} valid voter signatures of the {need} a quorum needs"
    return None


def make_cert(kind: Kind, term: int, subject: str, sigs: Iterable[VoterSignature], digest: str = "") -> QuorumCert:
    """A certificate from the signatures gathered (one per voter, in voter order)."""
    by_voter = {s.voter: s for s in sigs}
    return QuorumCert(kind=kind, term=term, subject=subject, digest=digest,
                      sigs=[by_voter[v] for v in sorted(by_voter)])


def verifier_of(identity: Identity) -> VerifyOne:
    """One signature checked with `identity` (the edge): the certificate sent with it, else the
    one last proven to be that voter's."""
    def verify(voter: str, text: bytes, sig: str, cert: str | None) -> bool:
        try:
            identity.verify(voter, text, sig, cert or identity.cert_of(voter))
        except AuthError:
            return False
        return True
    return verify


def signature_of(identity: Identity, text: bytes, voter: str) -> VoterSignature:
    sig, cert = identity.sign(text)
    return VoterSignature(voter=voter, sig=sig, cert=cert)
