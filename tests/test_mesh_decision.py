"""One value per key, decided through a quorum: the pure rules under random leader histories,
then the real procedure on three nodes."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.p2p.decision import Stored, choose_value, may_store
from app.coordination.p2p.election import votes_won
from app.coordination.p2p.identity import SharedKey
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.persist import CommitStore
from app.coordination.p2p.quorum_cert import ack_text, make_cert, signature_of, value_digest
from tests.mesh_helpers import free_ports, wait_for
from tests.test_mesh_node import leader_of, trio  # noqa: F401 - the fixture

VOTERS = ["a", "b", "c", "d", "e"]


def test_may_store_and_choose_value_by_example() -> None:
    assert may_store(None, "x", 1) == (True, "stored")
    assert may_store(Stored("x", 3), "x", 1)[0]  # the same value is always fine
    assert may_store(Stored("x", 3), "y", 4)[0]  # a later leader read a quorum first
    ok, why = may_store(Stored("x", 3), "y", 3)
    assert not ok and "term 3" in why
    assert choose_value([None, Stored("x", 2), Stored("y", 5), None], "z") == "y"
    assert choose_value([None, None], "z") == "z"
    assert choose_value([], None) is None


leader_turn = st.tuples(
    st.sets(st.sampled_from(VOTERS), min_size=1),  # who answered the read
    st.sets(st.sampled_from(VOTERS)),  # whom the store reached
    st.sampled_from(["p", "q", "r"]),  # what this leader proposes
)


@settings(max_examples=300, deadline=None)
@given(st.lists(leader_turn, min_size=1, max_size=8))
def test_once_a_quorum_stored_a_value_every_later_leader_decides_it(turns) -> None:
    """Leaders in rising terms, each reading whoever answered and storing wherever it reached,
    as `decide` does; a leader whose read is not a quorum gives up. Whatever a quorum stores
    first is the value of every later success: a key never takes a second value."""
    held: dict[str, Stored | None] = dict.fromkeys(VOTERS)
    decided: str | None = None
    for term, (readers, reached, proposal) in enumerate(turns, start=1):
        if not votes_won(VOTERS, readers):
            continue
        value = choose_value([held[v] for v in readers], proposal)
        stored_on = set()
        for v in sorted(reached):
            ok, _ = may_store(held[v], value, term)
            if ok:
                held[v] = Stored(value, max(term, held[v].term) if held[v] and held[v].value == value else term)
                stored_on.add(v)
        if votes_won(VOTERS, stored_on):
            assert decided in (None, value), (decided, value, term)
            decided = value


def test_commit_store_keeps_terms_and_reads_old_files(tmp_path: Path) -> None:
    path = tmp_path / "mesh_commits.json"
    path.write_text('{"generation/1": "old-bare-value"}')  # an earlier version's file
    store = CommitStore(path)
    assert store.get_stored("generation/1") == Stored("old-bare-value", 0)
    assert store.store("generation/2", "v", 4) == (True, "stored")
    assert not store.store("generation/2", "w", 4)[0]
    assert store.store("generation/1", "new", 2)[0]  # a bare old value was never known decided
    key = SharedKey(b"decision-test")
    sigs = [signature_of(key, ack_text(4, "generation/2", value_digest("v")), v) for v in VOTERS[:3]]
    cert = make_cert("ack", 4, "generation/2", sigs, digest=value_digest("v"))  # checked by the caller
    assert store.learn("generation/2", "v", cert) and store.decided_values() == {"generation/2": "v"}
    assert not store.learn("generation/2", "w", cert)  # another value is decided for the key
    assert not store.store("generation/2", "w", 9)[0]  # a decided value is never replaced, not even later
    again = CommitStore(path)
    assert again.get_stored("generation/1") == Stored("new", 2) and again.get("generation/2") == "v"
    assert again.decided_values() == {"generation/2": "v"}  # what was learned survives a restart
    assert again.certs["generation/2"] == cert  # with its certificate


async def test_values_decided_before_certificates_are_kept_marked_and_applied_only_once_certified(
        tmp_path: Path) -> None:
    """A mesh_commits.json of the version before quorum certificates marks values decided with
    no proof a majority agreed (the forged `generation/999` of issue 54 looked just like that).
    On start they are kept, marked `before_certificates` in the file and in /status, as stored
    values only: not decided here, not applied, not gossiped, until a leader decides the key
    again through the quorum and holds its certificate."""
    data = tmp_path / "solo"
    data.mkdir()
    (data / "mesh_commits.json").write_text(json.dumps({
        "generation/1": {"value": "g1", "term": 3, "decided": True},  # written before certificates
        "generation/2": {"value": "g2", "term": 3},  # stored, never known decided
    }))
    store = CommitStore(data / "mesh_commits.json")
    assert store.decided_values() == {} and list(store.before_certificates) == ["generation/1"]
    assert store.get_stored("generation/1") == Stored("g1", 3)  # what a quorum's read phase sees
    assert store.store("generation/3", "g3", 4)[0]  # any save keeps the mark in the file
    assert json.loads((data / "mesh_commits.json").read_text())["generation/1"] == {
        "value": "g1", "term": 3, "before_certificates": True}
    node = MeshNode(node_id="solo", host="127.0.0.1", port=free_ports(1)[0], data_dir=data, voters=["solo"],
                    profile="fast", secret=b"before-certificates")
    await node.start()
    try:
        async def leading() -> bool:
            return node.is_leader
        await wait_for(leading, 10.0)
        trust = node.status()["trust"]
        assert trust["decided_before_certificates"] == {"count": 1, "keys": ["generation/1"]}
        assert node.commits.decided_values() == {} and node.decided_for_gossip(("generation/",), 100) == []
        assert await node.decide("generation/1", None) == "g1"  # the leader decides it again, with proof
        assert node.commits.decided_values() == {"generation/1": "g1"} and "generation/1" in node.commits.certs
        assert node.status()["trust"]["decided_before_certificates"]["count"] == 0
        assert [e["key"] for e in node.decided_for_gossip(("generation/",), 100)] == ["generation/1"]
    finally:
        await node.stop()


async def test_a_half_stored_value_is_finished_by_the_leader_and_never_replaced(trio) -> None:  # noqa: F811
    leader = await leader_of(trio)
    # the leader holds a value an earlier leader stored on it alone: its own read always sees it
    leader.commits.store("generation/7", "half-stored", 0)
    assert await leader.decide("generation/7", "mine") == "half-stored"
    assert sum(n.commits.get_stored("generation/7") == Stored("half-stored", leader.term) for n in trio) >= 2
    assert await leader.decide("generation/7", "another") == "half-stored"

    async def everyone_learned() -> bool:  # the learn step reaches every voter, not gossip
        return all(n.commits.decided_values().get("generation/7") == "half-stored" for n in trio)
    await wait_for(everyone_learned, 5.0)
    assert await leader.commit("generation/7", "another") is False
    # a follower's tentative value from an older term: either may win, but only one, for good
    follower = next(n for n in trio if n is not leader)
    follower.commits.store("generation/8", "tentative", 0)
    first = await leader.decide("generation/8", "proposed")
    assert first in ("tentative", "proposed")
    assert all([await leader.decide("generation/8", x) == first for x in ("x", "y")])
    assert await leader.decide("generation/9", None) is None  # nothing proposed, nothing decided
    assert not any(n.stored_value("generation/9") for n in trio)
