"""Quorum certificates (issue 54, items 1 and 4): one compromised voter decides nothing.

The pure rule (`certificate_refusal`) under random signer sets, then a real trio on 127.0.0.1
with per-node keys, one of whose voters is in hostile hands: its forged `/commit` and
`/commit/decided` at term +1, +2 and +1,000, with or without a certificate of its own making,
are stored by no node; the leader's real commit is decided everywhere with its certificate;
a signed answer replayed as the answer to another request is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config import Settings
from app.config.mesh import MeshConfig
from app.coordination.p2p.client import AnswerRefused, MeshClient
from app.coordination.p2p.election import quorum_size
from app.coordination.p2p.identity import NodeKey
from app.coordination.p2p.quorum_cert import (
    ack_text,
    certificate_refusal,
    make_cert,
    signature_of,
    value_digest,
    vote_text,
)
from app.coordination.p2p.completions import done_text, sign_completion
from app.coordination.p2p.schemas import Completion, QuorumCert, Token, TokenRequest, VoterSignature
from app.coordination.p2p.work_rules import WorkSpec, completion_refusal
from tests.mesh_helpers import wait_for
from tests.test_mesh_hostile import durable, post_raw, settled
from tests.test_mesh_identity import certs, keys, signed_by, trio_of  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(120)
VOTERS = ["a", "b", "c", "d", "e"]


def voter_sig(voter: str, text: bytes) -> str:
    return hmac.new(voter.encode(), text, hashlib.sha256).hexdigest()


def check(voter: str, text: bytes, sig: str, cert: str | None) -> bool:
    """Each voter's own key (a test stand-in for its ECDSA key: only that voter can sign)."""
    return hmac.compare_digest(voter_sig(voter, text), sig)


signer = st.tuples(st.sampled_from([*VOTERS, "x", "y"]), st.booleans())  # (who signs, a valid signature?)


@settings(max_examples=400, deadline=None)
@given(voters=st.sets(st.sampled_from(VOTERS), min_size=1), signers=st.lists(signer, max_size=12),
       kind=st.sampled_from(["vote", "ack"]), term=st.integers(0, 2**53))
def test_a_certificate_holds_exactly_when_a_majority_of_voters_signed_that_subject(voters, signers, kind, term) -> None:
    digest = value_digest("v") if kind == "ack" else ""
    cert = QuorumCert(kind=kind, term=term, subject="s", digest=digest, sigs=[])
    text = ack_text(term, "s", digest) if kind == "ack" else vote_text(term, "s")
    cert = cert.model_copy(update={"sigs": [VoterSignature(voter=v, sig=voter_sig(v, text) if ok else "00" * 32)
                                            for v, ok in signers]})
    valid = {v for v, ok in signers if ok and v in voters}
    why = certificate_refusal(cert, voters, check, kind=kind, term=term, subject="s", digest=digest)
    assert (why is None) == (len(valid) >= quorum_size(voters)), (why, valid)
    if why is None:  # the same signatures prove nothing else
        other = "vote" if kind == "ack" else "ack"
        assert certificate_refusal(cert, voters, check, kind=other, term=term, subject="s", digest=digest)
        assert certificate_refusal(cert, voters, check, kind=kind, term=term + 1, subject="s", digest=digest)
        assert certificate_refusal(cert, voters, check, kind=kind, term=term, subject="t", digest=digest)
        if kind == "ack":
            assert certificate_refusal(cert, voters, check, kind=kind, term=None, subject="s",
                                       digest=value_digest("w"))
    assert certificate_refusal(None, voters, check, kind=kind, term=term, subject="s", digest=digest)


def node_key_trio(tmp_path: Path, certs: Path):  # type: ignore[no-untyped-def]  # noqa: F811
    return trio_of(tmp_path, lambda nid: Settings().model_copy(update={"mesh": MeshConfig(node_keys=keys(certs, nid))}))


async def test_a_voters_forged_decisions_are_stored_by_no_node_and_the_leaders_reach_all(
        tmp_path: Path, certs: Path) -> None:  # noqa: F811
    nodes = node_key_trio(tmp_path, certs)
    for n in nodes:
        await n.start()
    try:
        leader = await settled(nodes, 30.0)
        target, rogue = [n for n in nodes if n is not leader]
        key = NodeKey(keys(certs, rogue.node_id))  # the rogue voter's own key, in hostile hands
        assert target.status()["trust"]["protects_against_compromised_member"] is True
        term, before = leader.term, {n.node_id: durable(n) for n in nodes}
        value = json.dumps({"generation": 999, "sha256": "e" * 64, "promoted": True})
        digest = value_digest(value)
        for step in (1, 2, 1000):
            t = term + step
            own_vote = make_cert("vote", t, rogue.node_id, [signature_of(key, vote_text(t, rogue.node_id), rogue.node_id)])
            own_ack = signature_of(key, ack_text(t, "generation/999", digest), rogue.node_id)
            forged_ack = VoterSignature(voter=target.node_id, sig=own_ack.sig, cert=own_ack.cert)  # its key, another name
            decided = make_cert("ack", t, "generation/999", [own_ack, forged_ack], digest=digest)
            base = {"term": t, "leader_id": rogue.node_id, "key": "generation/999", "value": value}
            for path, body in (("/commit", base), ("/commit", {**base, "election": own_vote.model_dump()}),
                               ("/commit/decided", {**base, "decided": decided.model_dump()}),
                               ("/commit/decided", {**base, "election": own_vote.model_dump(),
                                                    "decided": decided.model_dump()})):
                for victim in (target, leader):
                    raw, headers = signed_by(key, victim, path, body, rogue.node_id)
                    status, data = await post_raw(victim.addr, path, raw, headers)
                    assert status in (200, 409) and data.get("stored") is False, (path, step, data)
                    assert "certificate" in data["reason"], data
        for n in nodes:
            assert n.commits.get("generation/999") is None and "generation/999" not in n.commits.decided_values()
            if n is not rogue:
                assert durable(n) == before[n.node_id]  # no term adopted, nothing stored
        assert leader.is_leader and leader.term == term and target.leader_id == leader.node_id
        refused = target.status()["trust"]["refused"]["in"]
        assert refused.get("no_election_certificate", 0) >= 3 and refused.get("decided_without_certificate", 0) >= 6

        # the same forgery by gossip: refused, counted, never applied
        forged = [{"key": "generation/999", "value": value, "cert": decided.model_dump()}]
        assert target.learn_decided(rogue.node_id, forged) == []

        # the leader's real commit is decided on every node, each holding the certificate
        real = json.dumps({"generation": 1, "sha256": "a" * 64, "promoted": True})
        assert await leader.commit("generation/1", real)

        async def everywhere() -> bool:
            return all(n.commits.decided_value("generation/1") == real and "generation/1" in n.commits.certs
                       for n in nodes)
        await wait_for(everywhere, 10.0)
        proof = leader.commits.certs["generation/1"]
        assert len({s.voter for s in proof.sigs}) >= 2 and proof.digest == value_digest(real)
        # a node that holds no value learns it from the certificate alone (gossip's path)
        fresh_entry = leader.decided_for_gossip(("generation/",), 10)
        rogue.commits.values.pop("generation/1", None)
        rogue.commits.decided.pop("generation/1", None)
        rogue.commits.certs.pop("generation/1", None)
        assert rogue.learn_decided(leader.node_id, fresh_entry) == ["generation/1"]
    finally:
        for n in nodes:
            await n.stop()


async def test_a_signed_answer_replayed_as_the_answer_to_another_request_is_refused(
        tmp_path: Path, certs: Path) -> None:  # noqa: F811
    nodes = node_key_trio(tmp_path, certs)
    for n in nodes:
        await n.start()
    client = MeshClient(NodeKey(keys(certs, "mallory")), timeout=5.0, node_id="mallory")
    try:
        target = nodes[0]
        headers = {"X-Mesh-From": "mallory", "X-Mesh-Nonce": "ab" * 16}
        async with client._sess().get(f"http://{target.addr}/status", headers=headers) as resp:
            body, answer = await resp.read(), resp.headers
            status = resp.status
        assert status == 200
        # the answer to GET /status checks as that ...
        assert client.check(target.addr, headers, status, answer, body, method="GET", path="/status") == "n0"
        # ... and as nothing else, though nonce, asker and answering node are the same
        for method, path in (("POST", "/vote"), ("GET", "/progress"), ("POST", "/status")):
            with pytest.raises(AnswerRefused, match="bad signature"):
                client.check(target.addr, headers, status, answer, body, method=method, path=path)
    finally:
        await client.close()
        for n in nodes:
            await n.stop()


ITEMS = [WorkSpec("demo", f"item{k}") for k in range(20)]


def test_a_completion_counts_only_for_the_live_claim() -> None:
    def why(**kw):  # type: ignore[no-untyped-def]
        args = dict(current_term=5, token=(5, 3), claimant="w", item_state="claimed", claimed_by="w", claim=(5, 3),
                    adopted=(None, None), newest_known=None, grant_proven=True)
        return completion_refusal(**{**args, **kw})
    assert why() is None  # the claim held now
    assert "stale" in why(claim=(5, 4)) and "stale" in why(claimed_by="x") and "stale" in why(item_state="pending")
    assert "future" in why(token=(6, 1))
    assert "ran out" in why(item_state="failed")
    # a token of an earlier term: its grant proven, and the live claim (adopted, or none later known)
    assert why(token=(4, 9), adopted=(4, 9)) is None
    assert "no proof" in why(token=(4, 9), adopted=(4, 9), grant_proven=False)
    assert "claimed under term 5" in why(token=(4, 9), adopted=(4, 8))
    assert why(token=(4, 9), item_state="pending", claim=(None, None)) is None
    assert why(token=(4, 9), item_state=None, claim=(None, None), newest_known=(4, 9)) is None
    assert "later claim" in why(token=(4, 9), item_state="pending", claim=(None, None), newest_known=(5, 1))


async def test_forged_completions_change_no_queue_and_a_real_one_survives_a_leader_change(
        tmp_path: Path, certs: Path) -> None:  # noqa: F811
    """Item 2 of issue 54: work completes only by its claimant's signed completion that the
    leader admits. A compromised member (`member`, which also does honest work) forges
    completions for others' items every way it can, in gossip and at /work/complete: no queue
    changes. Its real completions are admitted, one sent, one only gossiped with the token of
    the term before a leader change, and the new leader admits both."""
    nodes = node_key_trio(tmp_path, certs)
    for n in nodes:
        n.set_work_source(lambda view: ITEMS)
        await n.start()
    try:
        leader = await settled(nodes, 30.0)
        member, heir = [n for n in nodes if n is not leader]

        async def queued(node) -> bool:  # type: ignore[no-untyped-def]
            node.reconcile()
            return sum(node.queue.summary().values()) == len(ITEMS)
        await wait_for(lambda: queued(leader), 10.0)
        wc, hc = member.work_client(), heir.work_client()
        sent, gossiped, own = [await wc.claim(kinds=["demo"]) for _ in range(3)]
        theirs = await hc.claim(kinds=["demo"])
        assert sent and gossiped and own and theirs and sent.grant

        # -- forged at /work/complete: unsigned, another result, another node's claim
        def body(claim, completion, result=None):  # type: ignore[no-untyped-def]
            return TokenRequest(node_id=member.node_id, item_id=claim.item.item_id, token=claim.token,
                                result=result or {}, completion=completion)
        mine = sign_completion(member.identity, member.node_id, own.item.item_id, own.token, {}, own.grant)
        for req, status in ((body(own, None), 401), (body(own, mine, {"wins": 99}), 400),
                            (body(theirs, sign_completion(member.identity, member.node_id, theirs.item.item_id,
                                                          theirs.token, {}, theirs.grant)), 409)):
            got, answer = await member.client.request("POST", leader.addr, "/work/complete", req,
                                                      sender=member.node_id)
            assert got == status, (got, answer)

        # -- forged in gossip: unsigned, signed by the member in another's name, the member's own
        #    signature on others' items under tokens no leader granted it, a wrong token of its own
        others = [s.item_id for s in ITEMS if s.item_id not in {c.item.item_id for c in (sent, gossiped, own)}]
        forged = [Completion(node_id=heir.node_id, item_id=theirs.item.item_id, token=theirs.token, digest="0" * 64)]
        named = Completion(node_id=heir.node_id, item_id=others[1], token=theirs.token, digest="0" * 64)
        forged.append(named.model_copy(update={"sig": member.identity.sign(done_text(named))[0]}))
        forged += [sign_completion(member.identity, member.node_id, iid, Token(term=t, seq=900 + k), {},
                                   member.identity.sign(b"a grant of its own")[0])
                   for k, iid in enumerate(others[2:]) for t in (leader.term - 1, leader.term)]
        forged.append(sign_completion(member.identity, member.node_id, own.item.item_id,
                                      Token(term=own.token.term, seq=own.token.seq + 100), {}, own.grant))
        member.membership.update_local(completions=forged)

        async def heard(node, count) -> bool:  # type: ignore[no-untyped-def]
            st_ = node.membership.state_of(member.node_id)
            return st_ is not None and len(st_.completions) == count
        await wait_for(lambda: heard(leader, len(forged)), 10.0)
        leader.reconcile()
        assert leader.queue.summary() == {"pending": len(ITEMS) - 4, "claimed": 4, "done": 0, "failed": 0}
        refused = leader.status()["trust"]["refused"]["in"]
        for reason in ("completion_unsigned", "completion_bad_signature", "completion_not_live", "completion_mismatch"):
            assert refused.get(reason, 0) >= 1, (reason, refused)

        # -- the member's real completion, sent and admitted; another only gossiped, after a
        #    leader change, with the token of the term before: the new leader admits both
        assert (await wc.complete(sent, {"wins": 3})).ok
        assert leader.queue.item(sent.item.item_id)["state"] == "done"
        member.membership.update_local(completions=[*forged, *member.completions.for_gossip()])  # still forging
        await wait_for(lambda: heard(heir, len(forged) + 1), 10.0)
        alive = {n.node_id for n in nodes}
        assert await leader.consensus.transfer_leadership(heir.node_id, alive) is None
        new = await settled(nodes, 30.0)
        assert new is heir and new.term > gossiped.token.term
        await wait_for(lambda: queued(new), 10.0)
        assert new.queue.item(sent.item.item_id)["state"] == "done"  # carried across the change
        assert new.queue.item(gossiped.item.item_id)["claimed_by"] == member.node_id  # adopted on its grant
        late = sign_completion(member.identity, member.node_id, gossiped.item.item_id, gossiped.token, {"wins": 1},
                               gossiped.grant)
        member.completions.add_own(late)  # gossiped only, as if the old leader died before it was sent
        member.membership.update_local(completions=[*forged, *member.completions.for_gossip()])
        await wait_for(lambda: heard(new, len(forged) + 2), 10.0)
        new.reconcile()
        assert new.queue.item(gossiped.item.item_id)["state"] == "done"
        summary = new.queue.summary()
        assert summary["done"] == 2, summary  # nothing else: the forged completions changed no queue here either
        refused = new.status()["trust"]["refused"]["in"]
        assert refused.get("completion_bad_signature", 0) >= 1 and refused.get("completion_grant_unproven", 0) >= 1
    finally:
        for n in nodes:
            await n.stop()
