"""Wire formats between nodes: one pydantic model per request/response body.

Models are strict about unknown keys on requests so a typo or a version skew is a 400 with a
message rather than a silently ignored field. Numbers are bounded: terms and sequence numbers
fit a signed 64-bit integer with room to grow (MAX_TERM), floats are finite, so no message can
push a value past what the work queue's columns hold. A term is *adopted* only far below that
bound (election.TERM_CEILING and the bounded step), so the next election always has room.
Gossip carries each node's state as its owner signed it (SignedState), so a relay cannot
change what another node says about itself. Capabilities are typed (cpus, gpus,
memory_gb, plus short scalar extras); inventory and payloads stay free-form because their
contents belong to other layers (the parser bounds their depth and size: server.py).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NodeId = str
_ID = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")
MAX_TERM = 2**53  # far below 2**63 - 1: decades of elections and claims fit, and JSON doubles hold it exactly
MAX_STATE_TEXT = 1_048_576  # one node's signed state, as JSON text
MAX_CERT_TEXT = 4096  # a base64 DER certificate
MAX_SIGNATURES = 64  # voter signatures in one quorum certificate
TermInt = Annotated[int, Field(ge=0, le=MAX_TERM)]
SmallInt = Annotated[int, Field(ge=-(2**31), le=2**31)]
Caps = Annotated[dict[str, Any], Field(default_factory=dict)]


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class Capabilities(Wire):
    """What a worker says it has; `fits` (work_rules.py) compares it with an item's requirements."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    cpus: int = Field(default=0, ge=0, le=1_000_000)
    gpus: int = Field(default=0, ge=0, le=100_000)
    memory_gb: float = Field(default=0.0, ge=0, le=1e9)


def typed_capabilities(raw: Any) -> dict[str, Any]:
    """Validate a capabilities map (typed known keys, at most 32 short scalar extras) and return
    it as the plain dict the other layers read."""
    if not isinstance(raw, dict):
        raise ValueError("capabilities must be an object")  # noqa: TRY004 - pydantic reports ValueError as a 400
    if len(raw) > 32:
        raise ValueError("at most 32 capabilities")
    caps = Capabilities.model_validate(raw)
    extras = caps.model_extra or {}
    for key, value in extras.items():
        if len(key) > 64 or not (value is None or isinstance(value, (bool, int, float, str))):
            raise ValueError(f"capability {key[:64]!r}: expected a short name and a scalar value")
        if isinstance(value, str) and len(value) > 256:
            raise ValueError(f"capability {key!r}: value longer than 256 characters")
        if isinstance(value, int) and abs(value) > 2**53:
            raise ValueError(f"capability {key!r}: integer out of range")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"capability {key!r}: not a finite number")
    return caps.model_dump()


class Token(Wire):
    """Fencing token of a claim: a claim is valid only under the leader of `term`."""

    term: TermInt
    seq: TermInt


class ClaimInfo(Wire):
    """A claim a worker holds, gossiped so a new leader knows what was in flight."""

    item_id: str = Field(max_length=512)
    token: Token
    attempts: int = Field(default=1, ge=0, le=2**31)
    expires_at: float = 0.0
    grant: str = Field(default="", max_length=256)  # the granting leader's signature (completions.grant_text)


class Completion(Wire):
    """A claimant's signed word that it finished `item_id` under `token` with a result of
    `digest`; with the granting leader's signature over the claim. Work completes only by one
    of these that the leader admits (completions.py); any node may relay it, none can forge it."""

    node_id: NodeId = _ID  # the claimant, whose key signed `sig`
    item_id: str = Field(min_length=1, max_length=512)
    token: Token
    digest: str = Field(max_length=64)  # sha256 of the result (completions.result_digest)
    sig: str = Field(default="", max_length=256)
    grant: str = Field(default="", max_length=256)


class NodeState(Wire):
    """What a node says about itself; the newer (incarnation, version) wins everywhere."""

    node_id: NodeId = _ID
    addr: str = Field(default="", max_length=256)
    incarnation: TermInt = 0
    version: TermInt = 0
    role: str = Field(default="follower", max_length=32)
    term: TermInt = 0  # what the node says; never adopted from gossip (consensus.py)
    leader: str | None = Field(default=None, max_length=128)
    priority: SmallInt = 0
    voter: bool = False
    capabilities: Caps
    inventory: dict[str, Any] = {}
    claims: list[ClaimInfo] = Field(default_factory=list, max_length=1024)
    # signed completions this node relays: its own as a claimant, and (a leader) those it admitted
    completions: list[Completion] = Field(default_factory=list, max_length=256)

    @field_validator("capabilities")
    @classmethod
    def _typed(cls, v: dict[str, Any]) -> dict[str, Any]:
        return typed_capabilities(v)

    def stamp(self) -> tuple[int, int]:
        return (self.incarnation, self.version)


class SignedState(Wire):
    """A node's state as the JSON text its owner signed (identity.py) with `state_text`'s framing;
    relays pass it on unchanged, so only the owner can say a thing about itself."""

    state: str = Field(min_length=2, max_length=MAX_STATE_TEXT)
    sig: str = Field(default="", max_length=256)
    cert: str | None = Field(default=None, max_length=4096)  # per-node keys: the owner's certificate


def state_text(state_json: str) -> bytes:
    """The bytes an owner's signature over its gossiped state covers."""
    return b"mesh-state\n" + state_json.encode()


class GossipMessage(Wire):
    sender: NodeId = _ID
    states: list[SignedState] = Field(default_factory=list, max_length=4096)
    view: dict[str, str] = {}  # sender's liveness of each node: alive / suspect / dead

    @field_validator("view")
    @classmethod
    def _bounded_view(cls, v: dict[str, str]) -> dict[str, str]:
        if len(v) > 4096 or any(len(k) > 128 or len(x) > 16 for k, x in v.items()):
            raise ValueError("at most 4096 entries of a node id and a liveness word")
        return v


Kind = Literal["vote", "ack"]


class VoterSignature(Wire):
    voter: NodeId = _ID
    sig: str = Field(min_length=1, max_length=256)
    cert: str | None = Field(default=None, max_length=MAX_CERT_TEXT)  # per-node keys; gossip leaves it out


class QuorumCert(Wire):
    """`kind` vote: `subject` is the candidate elected in `term`; `kind` ack: `subject` is the
    key and `digest` the sha256 of the value a quorum stored in `term`."""

    kind: Kind
    term: TermInt
    subject: str = Field(min_length=1, max_length=256)
    digest: str = Field(default="", max_length=64)
    sigs: list[VoterSignature] = Field(default_factory=list, max_length=MAX_SIGNATURES)

    def without_certs(self) -> QuorumCert:
        """The same proof, its signers' certificates left out (the receiver knows them already)."""
        return self.model_copy(update={"sigs": [s.model_copy(update={"cert": None}) for s in self.sigs]})


class VoteRequest(Wire):
    term: TermInt
    candidate_id: NodeId = _ID
    priority: SmallInt = 0
    pre_vote: bool = False
    transfer_from: NodeId | None = Field(default=None, min_length=1, max_length=128)  # a leader's handover


class TimeoutNowRequest(Wire):
    """Leader -> chosen successor: I have stepped down; stand for election now (transfer.py)."""

    term: TermInt
    leader_id: NodeId = _ID
    election: QuorumCert | None = None  # the majority's signed votes that made leader_id leader of term


class TransferRequest(Wire):
    """Operator -> leader: hand leadership to `target`, a live voter."""

    target: NodeId = _ID


class VoteResponse(Wire):
    term: TermInt
    granted: bool
    reason: str = ""
    voter_id: NodeId = ""
    sig: str = Field(default="", max_length=256)  # granted: the voter's signature (quorum_cert.py)
    cert: str | None = Field(default=None, max_length=MAX_CERT_TEXT)


class HeartbeatRequest(Wire):
    term: TermInt
    leader_id: NodeId = _ID
    sent_at: float = 0.0
    election: QuorumCert | None = None  # the majority's signed votes that made leader_id leader of term


class HeartbeatResponse(Wire):
    term: TermInt
    ok: bool
    node_id: NodeId = ""
    reason: str = ""


class CommitRequest(Wire):
    term: TermInt
    leader_id: NodeId = _ID
    key: str = Field(min_length=1, max_length=256)
    value: str = Field(max_length=4096)
    election: QuorumCert | None = None  # the majority's signed votes that made leader_id leader of term
    decided: QuorumCert | None = None  # /commit/decided: the quorum's signed acks of (key, value)


class CommitResponse(Wire):
    term: TermInt
    stored: bool
    reason: str = ""
    sig: str = Field(default="", max_length=256)  # granted: the voter's signature (quorum_cert.py)
    cert: str | None = Field(default=None, max_length=MAX_CERT_TEXT)


class CommitReadRequest(Wire):
    """Phase 1 of a decision (app/coordination/p2p/decision.py): what do you hold for `key`?"""

    term: TermInt
    leader_id: NodeId = _ID
    key: str = Field(min_length=1, max_length=256)
    election: QuorumCert | None = None  # the majority's signed votes that made leader_id leader of term


class CommitReadResponse(Wire):
    term: TermInt
    ok: bool  # False: the request's term was stale
    value: str | None = None
    value_term: TermInt | None = None


class ClaimRequest(Wire):
    node_id: NodeId = _ID  # must be the sender (server.py)
    capabilities: Caps
    kinds: list[str] | None = Field(default=None, max_length=64)

    @field_validator("capabilities")
    @classmethod
    def _typed(cls, v: dict[str, Any]) -> dict[str, Any]:
        return typed_capabilities(v)


class WorkItemOut(Wire):
    item_id: str
    kind: str
    key: str
    payload: dict[str, Any]
    requirements: dict[str, Any]
    attempts: int


class ClaimResponse(Wire):
    status: Literal["claimed", "no_work"]
    item: WorkItemOut | None = None
    token: Token | None = None
    ttl: float | None = None
    election: QuorumCert | None = None  # the granting leader's election certificate for the token's term
    grant: str = Field(default="", max_length=256)  # the leader's signature over the claim (completions.grant_text)


class TokenRequest(Wire):
    """Body of renew / complete / fail."""

    node_id: NodeId = _ID
    item_id: str = Field(min_length=1, max_length=512)
    token: Token
    result: dict[str, Any] = {}
    error: str = Field(default="", max_length=4096)
    completion: Completion | None = None  # /work/complete: the claimant's signed completion of `result`


class TokenResponse(Wire):
    ok: bool
    reason: str = ""
    ttl: float | None = None
    token: Token | None = None  # a renew under a new leader: the token to use from now on
    grant: str = Field(default="", max_length=256)  # the leader's signature over that token's claim
