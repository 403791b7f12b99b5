"""Wire formats between nodes: one pydantic model per request/response body.

Models are strict about unknown keys on requests so a typo or a version skew is a 400 with a
message rather than a silently ignored field. Free-form maps (capabilities, inventory,
payloads) stay dicts because their contents belong to other layers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

NodeId = str
_ID = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")


class Wire(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Token(Wire):
    """Fencing token of a claim: a claim is valid only under the leader of `term`."""

    term: int = Field(ge=0)
    seq: int = Field(ge=0)


class ClaimInfo(Wire):
    """A claim a worker holds, gossiped so a new leader knows what was in flight."""

    item_id: str = Field(max_length=512)
    token: Token
    attempts: int = Field(default=1, ge=0)
    expires_at: float = 0.0


class NodeState(Wire):
    """What a node says about itself; the newer (incarnation, version) wins everywhere."""

    node_id: NodeId = _ID
    addr: str = Field(default="", max_length=256)
    incarnation: int = Field(default=0, ge=0)
    version: int = Field(default=0, ge=0)
    role: str = "follower"
    term: int = Field(default=0, ge=0)
    leader: str | None = None
    priority: int = 0
    voter: bool = False
    capabilities: dict[str, Any] = {}
    inventory: dict[str, Any] = {}
    claims: list[ClaimInfo] = []
    completed: list[str] = []  # leader only: recently completed work item ids

    def stamp(self) -> tuple[int, int]:
        return (self.incarnation, self.version)


class GossipMessage(Wire):
    sender: NodeId = _ID
    states: list[NodeState] = Field(default_factory=list, max_length=4096)
    view: dict[str, str] = {}  # sender's liveness of each node: alive / suspect / dead


class VoteRequest(Wire):
    term: int = Field(ge=0)
    candidate_id: NodeId = _ID
    priority: int = 0
    pre_vote: bool = False
    transfer_from: NodeId | None = Field(default=None, min_length=1, max_length=128)  # a leader's handover


class TimeoutNowRequest(Wire):
    """Leader -> chosen successor: I have stepped down; stand for election now (transfer.py)."""

    term: int = Field(ge=0)
    leader_id: NodeId = _ID


class TransferRequest(Wire):
    """Operator -> leader: hand leadership to `target`, a live voter."""

    target: NodeId = _ID


class VoteResponse(Wire):
    term: int
    granted: bool
    reason: str = ""
    voter_id: NodeId = ""


class HeartbeatRequest(Wire):
    term: int = Field(ge=0)
    leader_id: NodeId = _ID
    sent_at: float = 0.0


class HeartbeatResponse(Wire):
    term: int
    ok: bool
    node_id: NodeId = ""


class CommitRequest(Wire):
    term: int = Field(ge=0)
    leader_id: NodeId = _ID
    key: str = Field(min_length=1, max_length=256)
    value: str = Field(max_length=4096)


class CommitResponse(Wire):
    term: int
    stored: bool
    reason: str = ""


class CommitReadRequest(Wire):
    """Phase 1 of a decision (app/coordination/p2p/decision.py): what do you hold for `key`?"""

    term: int = Field(ge=0)
    leader_id: NodeId = _ID
    key: str = Field(min_length=1, max_length=256)


class CommitReadResponse(Wire):
    term: int
    ok: bool  # False: the request's term was stale
    value: str | None = None
    value_term: int | None = None


class ClaimRequest(Wire):
    node_id: NodeId = _ID
    capabilities: dict[str, Any] = {}
    kinds: list[str] | None = None


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


class TokenRequest(Wire):
    """Body of renew / complete / fail."""

    node_id: NodeId = _ID
    item_id: str = Field(min_length=1, max_length=512)
    token: Token
    result: dict[str, Any] = {}
    error: str = Field(default="", max_length=4096)


class TokenResponse(Wire):
    ok: bool
    reason: str = ""
    ttl: float | None = None
