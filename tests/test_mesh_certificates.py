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
from app.coordination.p2p.schemas import QuorumCert, VoterSignature
from app.coordination.p2p.work_rules import WorkSpec, completion_writer_refusal
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


def test_completed_work_is_taken_from_the_proven_leader_only() -> None:
    assert completion_writer_refusal("n1", "leader", 4, "n1") is None
    assert "only the leader" in completion_writer_refusal("n1", "follower", 4, "n0")
    assert "not the proven leader" in completion_writer_refusal("n1", "leader", 4, "n0")
    assert "no election certificate" in completion_writer_refusal("n1", "leader", 5, None)


async def test_a_members_completed_gossip_for_others_items_changes_no_queue(tmp_path: Path, certs: Path) -> None:  # noqa: F811
    nodes = node_key_trio(tmp_path, certs)
    for n in nodes:
        n.set_work_source(lambda view: ITEMS)
        await n.start()
    try:
        leader = await settled(nodes, 30.0)
        rogue, heir = [n for n in nodes if n is not leader]

        async def queued(node) -> bool:  # type: ignore[no-untyped-def]
            node.reconcile()
            return node.queue.summary()["pending"] == len(ITEMS)
        await wait_for(lambda: queued(leader), 10.0)
        # the rogue says it completed everyone's work (its own state, signed by itself); as
        # "leader" of a term it was not proven leader of it is refused the same (the pure test)
        rogue.membership.update_local(completed=[s.item_id for s in ITEMS])

        async def heard() -> bool:
            st_ = leader.membership.state_of(rogue.node_id)
            return st_ is not None and bool(st_.completed) and bool(heir.membership.state_of(rogue.node_id).completed)
        await wait_for(heard, 10.0)
        leader.reconcile()
        assert leader.queue.summary() == {"pending": len(ITEMS), "claimed": 0, "done": 0, "failed": 0}
        refused_first = leader.status()["trust"]["refused"]["in"].get("field_not_owner", 0)

        # after a leader change the new leader's queue is as untouched
        alive = {n.node_id for n in nodes}
        assert await leader.consensus.transfer_leadership(heir.node_id, alive) is None
        new = await settled(nodes, 30.0)
        assert new is heir
        rogue.membership.update_local(completed=[s.item_id for s in ITEMS])  # still gossiping it
        await wait_for(lambda: queued(new), 10.0)
        new.reconcile()
        assert new.queue.summary() == {"pending": len(ITEMS), "claimed": 0, "done": 0, "failed": 0}
        assert refused_first >= 1 and new.status()["trust"]["refused"]["in"].get("field_not_owner", 0) >= 1
        # a claim comes with the granting leader's election certificate, which the worker checks
        claim = await rogue.work_client().claim()
        assert claim is not None and claim.token.term == new.term
        assert rogue.consensus.election_refusal(new.term + 1, new.node_id, None) == "no vote certificate"
    finally:
        for n in nodes:
            await n.stop()
