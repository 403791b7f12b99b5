"""Worker side of the work queue: find the leader, claim, renew, complete, fail.

A claim is only as good as its fencing token: any 409 means the claim is gone (a new leader
that did not adopt it, an expiry, a reassignment) and the worker must drop the work, not retry
the same token. A new leader that adopted the claim answers the next renew with a token of its
term; the client keeps it (in `held`) and uses it for every later call on that claim.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.completions import sign_completion
from app.coordination.p2p.schemas import (
    ClaimInfo,
    ClaimResponse,
    Completion,
    QuorumCert,
    Token,
    TokenRequest,
    WorkItemOut,
)
from app.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Claim:
    item: WorkItemOut
    token: Token
    ttl: float
    leader_addr: str
    grant: str = ""  # the granting leader's signature over the claim (completions.grant_text)


@dataclass(frozen=True)
class Outcome:
    ok: bool
    status: int  # HTTP status; 409 = stale token, 0 = no answer
    reason: str = ""


class WorkClient:
    def __init__(
        self, client: MeshClient, node_id: str, addrs: Callable[[], Iterable[str]],
        capabilities: Callable[[], dict[str, Any]] = dict,
        on_claims_changed: Callable[[list[ClaimInfo]], None] | None = None,
        leader_proof: Callable[[str, int, QuorumCert | None], str | None] | None = None,
        on_completed: Callable[[Completion], None] | None = None,
    ) -> None:
        """`leader_proof(answering node, the token's term, its election certificate)`: why a
        claim from that node is not to be trusted (None: it is the proven leader of that term).
        `on_completed`: each completion this worker signed and the leader took or did not
        answer (e.g. gossip it, so a new leader admits it if the old one is gone)."""
        self.on_completed = on_completed
        self.client = client
        self.leader_proof = leader_proof
        self.node_id = node_id
        self.addrs = addrs  # where to ask for the leader (peers, or the local node)
        self.capabilities = capabilities
        self.on_claims_changed = on_claims_changed  # e.g. gossip them, so a new leader knows
        self.held: dict[str, ClaimInfo] = {}

    def _track(self, claim: Claim, holding: bool) -> None:
        if holding:
            self.held[claim.item.item_id] = ClaimInfo(
                item_id=claim.item.item_id, token=claim.token, attempts=claim.item.attempts,
                expires_at=time.time() + claim.ttl, grant=claim.grant,
            )
        else:
            self.held.pop(claim.item.item_id, None)
        if self.on_claims_changed is not None:
            self.on_claims_changed(list(self.held.values()))

    async def find_leader(self) -> str | None:
        for addr in self.addrs():
            status = await self.client.get_json(addr, "/status")
            if isinstance(status, dict):
                if status.get("role") == "leader":
                    return addr
                if status.get("leader_addr"):
                    return str(status["leader_addr"])
        return None

    async def claim(self, training: bool = False, kinds: list[str] | None = None) -> Claim | None:
        leader = await self.find_leader()
        if leader is None:
            return None
        path = "/work/claim_training" if training else "/work/claim"
        body = {"node_id": self.node_id, "capabilities": self.capabilities(), "kinds": kinds}
        try:
            status, data = await self.client.request("POST", leader, path, body, sender=self.node_id)
        except Exception:  # noqa: BLE001 - no answer is "no claim"
            return None
        if status != 200 or not isinstance(data, dict):
            return None
        resp = ClaimResponse.model_validate(data)
        if resp.status != "claimed" or resp.item is None or resp.token is None:
            return None
        if self.leader_proof is not None:  # a claim only from a leader proven for the token's term
            answerer = self.client.peers.get(leader, ("", 0))[0]
            why = self.leader_proof(answerer, resp.token.term, resp.election)
            if why is not None:
                log.warning("claim_refused", leader=answerer or leader, reason=why)
                return None
        claim = Claim(resp.item, resp.token, float(resp.ttl or 0), leader, resp.grant)
        self._track(claim, True)
        return claim

    def token_of(self, claim: Claim) -> Token:
        """The newest token of `claim` (a new leader may have handed one out at a renew)."""
        held = self.held.get(claim.item.item_id)
        return held.token if held is not None else claim.token

    async def _token_call(self, path: str, claim: Claim, **extra: Any) -> Outcome:
        body = TokenRequest(node_id=self.node_id, item_id=claim.item.item_id, token=self.token_of(claim), **extra)
        leader = await self.find_leader() or claim.leader_addr
        try:
            status, data = await self.client.request("POST", leader, path, body, sender=self.node_id)
        except Exception as exc:  # noqa: BLE001
            return Outcome(False, 0, f"no answer: {exc!r}")
        reason = data.get("reason", "") if isinstance(data, dict) else str(data)
        new_token = data.get("token") if status == 200 and isinstance(data, dict) else None
        held = self.held.get(claim.item.item_id)
        if isinstance(new_token, dict) and held is not None and path == "/work/renew":
            token = Token.model_validate(new_token)
            if token != held.token:
                self.held[claim.item.item_id] = held.model_copy(update={"token": token, "grant": str(data.get("grant") or "")[:256]})
                if self.on_claims_changed is not None:
                    self.on_claims_changed(list(self.held.values()))
        if status == 409 or (status == 200 and path != "/work/renew"):
            self._track(claim, False)  # finished, or the claim is gone: stop advertising it
        return Outcome(status == 200, status, reason)

    async def renew(self, claim: Claim) -> Outcome:
        return await self._token_call("/work/renew", claim)

    async def keep_alive(self, claim: Claim) -> Outcome:
        """Renew every third of the TTL until the claim is gone (409); returns that refusal.
        A missing answer is not a loss: the next renewal may reach a new leader in time."""
        while True:
            await asyncio.sleep(max(0.2, claim.ttl / 3))
            outcome = await self.renew(claim)
            if outcome.status == 409:
                return outcome

    async def complete(self, claim: Claim, result: dict[str, Any] | None = None) -> Outcome:
        """Send this worker's signed completion (item, token, result digest) to the leader."""
        held = self.held.get(claim.item.item_id)
        completion = sign_completion(self.client.identity, self.node_id, claim.item.item_id, self.token_of(claim),
                                     result or {}, held.grant if held is not None else claim.grant)
        outcome = await self._token_call("/work/complete", claim, result=result or {}, completion=completion)
        if self.on_completed is not None and (outcome.ok or outcome.status == 0):
            self.on_completed(completion)
        return outcome

    async def fail(self, claim: Claim, error: str) -> Outcome:
        return await self._token_call("/work/fail", claim, error=error)
