"""Work completes only by its claimant's signed completion that the leader admits (issue 54).

The leader signs each claim it grants (`grant_text`: term, seq, item, holder); the claimant
signs its completion (`done_text`: itself, the item, the token, sha256 of the result) and sends
it with /work/complete; the leader admits it only if the token is the claim it granted, keeps it
on the queue's row and gossips the newest it admitted. The claimant gossips its own too, so a
completion outlives the leader that was sent it: after a leader change the new leader admits a
completion of an earlier term's token when that term's proven leader (election certificate)
signed the grant and the claim was the live one (`work_rules.completion_refusal`), and adopts
a gossiped claim only on such a grant. Any node may relay a completion; only its claimant can
sign one and only a proven leader can grant the claim, so gossip marks no work done by itself.
Refusals are counted once each by reason (`completion_*`, `claim_grant_unproven`: the
`mesh_refusals_total` metric and /status `trust`).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from app.coordination.p2p.identity import Identity
from app.coordination.p2p.membership import Membership
from app.coordination.p2p.quorum_cert import VerifyOne, verifier_of
from app.coordination.p2p.refusals import Refusals
from app.coordination.p2p.schemas import ClaimInfo, Completion, Token, TokenRequest
from app.coordination.p2p.view import ClusterView
from app.coordination.p2p.work_queue import WorkQueue

MAX_GOSSIPED = 256  # schemas.NodeState.completions
K = TypeVar("K")


def result_digest(result: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(result, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def grant_text(token: Token, item_id: str, holder: str) -> bytes:
    return f"mesh-grant\n{token.term}\n{token.seq}\n{item_id}\n{holder}".encode()


def done_text(c: Completion) -> bytes:
    return f"mesh-done\n{c.node_id}\n{c.item_id}\n{c.token.term}\n{c.token.seq}\n{c.digest}".encode()


def sign_grant(identity: Identity, token: Token, item_id: str, holder: str) -> str:
    return identity.sign(grant_text(token, item_id, holder))[0]


def sign_completion(identity: Identity, node_id: str, item_id: str, token: Token, result: Mapping[str, Any],
                    grant: str) -> Completion:
    c = Completion(node_id=node_id, item_id=item_id, token=token, digest=result_digest(result), grant=grant)
    return c.model_copy(update={"sig": identity.sign(done_text(c))[0]})


def signature_problem(verify: VerifyOne, c: Completion) -> tuple[str, str] | None:
    """(refusal code, reason) unless `c` is signed by the claimant it names."""
    if not c.sig:
        return "completion_unsigned", f"the completion of {c.item_id} is unsigned"
    if not verify(c.node_id, done_text(c), c.sig, None):
        return "completion_bad_signature", f"the completion of {c.item_id} is not signed by its claimant {c.node_id}"
    return None


def request_problem(verify: VerifyOne, req: TokenRequest) -> tuple[str, str] | None:
    """/work/complete: (refusal code, reason) unless the body carries the sender's signed
    completion of this very item, token and result."""
    c = req.completion
    if c is None:
        return "completion_unsigned", "no signed completion (the claimant signs item, token and result digest)"
    if (c.node_id, c.item_id, c.token) != (req.node_id, req.item_id, req.token):
        return "completion_mismatch", "the completion names another node, item or token than the request"
    if c.digest != result_digest(req.result):
        return "completion_mismatch", "the completion's digest is not the result's"
    return signature_problem(verify, c)


def grant_proven(verify: VerifyOne, certified: Mapping[int, str], token: Token, item_id: str, holder: str,
                 grant: str) -> bool:
    """The leader of `token.term` whose election certificate this node checked signed this claim."""
    leader = certified.get(token.term)
    return bool(grant) and leader is not None and verify(leader, grant_text(token, item_id, holder), grant, None)


def _remember(cache: OrderedDict[K, bool], key: K, verdict: bool, limit: int) -> None:
    cache[key] = verdict
    while len(cache) > limit:
        cache.popitem(last=False)


class CompletionBook:
    """A node's completions: its own as a claimant, the leader's admitted ones (both gossiped,
    bounded), and the verdicts on what gossip carried (each completion and grant checked once:
    a signature check is a public-key operation; bounded). A completion is ~450 bytes on the
    wire with node keys and every state is relayed each gossip round, so a node gossips its own
    last 16 and a leader the queue's last 64 (WorkQueue.recent_completions): enough to carry the
    completions a leader change can interrupt, where the bare id list was 200 short strings."""

    def __init__(self, identity: Identity, refusals: Refusals, own_limit: int = 16, cache_limit: int = 4096) -> None:
        self.verify = verifier_of(identity)
        self.refusals = refusals
        self.own_limit, self.cache_limit = own_limit, cache_limit
        self.own: OrderedDict[tuple[str, int, int], Completion] = OrderedDict()
        self.admitted: list[Completion] = []  # the queue's newest, as of this node's last reconcile as leader
        self._verdicts: OrderedDict[tuple[str, ...], bool] = OrderedDict()
        self._grants: OrderedDict[tuple[str, ...], bool] = OrderedDict()

    def add_own(self, c: Completion) -> None:
        key = (c.item_id, c.token.term, c.token.seq)
        self.own[key] = c
        self.own.move_to_end(key)
        while len(self.own) > self.own_limit:
            self.own.popitem(last=False)

    def for_gossip(self) -> list[Completion]:
        merged = {(c.item_id, c.token.term, c.token.seq): c for c in self.admitted}
        merged.update(((c.item_id, c.token.term, c.token.seq), c) for c in reversed(self.own.values()))
        return list(merged.values())[:MAX_GOSSIPED]

    def publish(self, membership: Membership) -> None:
        """Gossip `for_gossip()` with this node's state (re-signed only when it changed)."""
        done = self.for_gossip()
        if done != membership.local.completions:
            membership.update_local(completions=done)

    def proven_claims(self, live: Iterable[tuple[str, ClaimInfo]], certified: Mapping[int, str]
                      ) -> list[tuple[str, ClaimInfo]]:
        """The gossiped claims a leader may adopt: those whose grant the proven leader of their
        term signed; the others are refused (counted once each)."""
        out = []
        for holder, info in live:
            key = (holder, info.item_id, str(info.token.term), str(info.token.seq), info.grant)
            ok = self._grants.get(key)
            if ok is None:
                ok = grant_proven(self.verify, certified, info.token, info.item_id, holder, info.grant)
                _remember(self._grants, key, ok, self.cache_limit)
                if not ok:
                    self.refusals.refused_in(holder, "claim_grant_unproven",
                                             f"claim on {info.item_id[:128]} at {info.token.term}/{info.token.seq}: "
                                             "no grant by that term's proven leader")
            if ok:
                out.append((holder, info))
        return out

    def admit_gossiped(self, queue: WorkQueue, view: ClusterView, term: int, certified: Mapping[int, str],
                       now: float) -> int:
        """Leader: admit the completions gossip carries whose tokens were live claims
        (WorkQueue.admit); the number newly admitted or found done. `admitted` is then the
        queue's newest, which this leader gossips."""
        newest: dict[str, tuple[int, int]] = {}
        for state in view.nodes.values():
            for claim in state.claims:
                newest[claim.item_id] = max(newest.get(claim.item_id, (0, 0)), (claim.token.term, claim.token.seq))
        admitted = 0
        fresh = [(s.node_id, c, (c.node_id, c.item_id, str(c.token.term), str(c.token.seq), c.digest, c.sig))
                 for s in view.nodes.values() for c in s.completions]
        fresh = [f for f in fresh if f[2] not in self._verdicts]
        # only completions of items still open here cost a signature check: one of an item done,
        # failed or not queued changes nothing (and a member's junk costs the leader no CPU)
        open_items = queue.open_items({c.item_id for _, c, _ in fresh})
        for relayer, c, key in fresh:
            if c.item_id not in open_items:
                continue
            problem = signature_problem(self.verify, c)
            if problem is None:
                proven = grant_proven(self.verify, certified, c.token, c.item_id, c.node_id, c.grant)
                why = queue.admit(c, term, now, newest.get(c.item_id), proven)
                if why is not None:
                    problem = ("completion_not_live" if proven or c.token.term >= term else "completion_grant_unproven",
                               why)
            _remember(self._verdicts, key, problem is None, self.cache_limit)
            if problem is None:
                admitted += 1
                continue
            self.refusals.refused_in(relayer, problem[0], f"completion of {c.item_id[:128]} by {c.node_id} at "
                                                          f"{c.token.term}/{c.token.seq}: {problem[1]}"[:300])
        self.admitted = queue.recent_completions()
        return admitted
