"""Membership table and gossip merge rules (no I/O)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.p2p.membership import Liveness, Membership, is_newer, liveness_of
from app.coordination.p2p.schemas import GossipMessage, NodeState, SignedState

pytestmark = pytest.mark.timeout(120)


def member(node_id: str, now: float = 0.0, relay_step: int | None = None) -> Membership:
    return Membership(NodeState(node_id=node_id), suspect_after=1.0, dead_after=3.0, now=now, relay_step=relay_step)


def env(state: NodeState) -> SignedState:
    """A state as gossip carries it (unsigned: these tests are about the merge rules)."""
    return SignedState(state=state.model_dump_json())


def test_liveness_thresholds() -> None:
    assert liveness_of(0.99, 1.0, 3.0) is Liveness.ALIVE
    assert liveness_of(1.0, 1.0, 3.0) is Liveness.SUSPECT
    assert liveness_of(2.99, 1.0, 3.0) is Liveness.SUSPECT
    assert liveness_of(3.0, 1.0, 3.0) is Liveness.DEAD


def test_alive_suspect_dead_then_back_alive_on_newer_stamp() -> None:
    a, b = member("a"), member("b")
    a.merge(b.message(0.0), now=0.0)
    assert a.liveness("b", 0.5) is Liveness.ALIVE
    assert a.liveness("b", 1.5) is Liveness.SUSPECT
    assert a.liveness("b", 3.5) is Liveness.DEAD
    a.merge(GossipMessage(sender="c", states=[env(b.local)]), now=4.0)  # same stamp: no news
    assert a.liveness("b", 4.0) is Liveness.DEAD
    b.tick()
    a.merge(GossipMessage(sender="c", states=[env(b.local)]), now=4.0)  # relayed newer stamp: alive
    assert a.liveness("b", 4.0) is Liveness.ALIVE
    assert a.liveness("unknown", 4.0) is Liveness.DEAD
    assert a.liveness("a", 100.0) is Liveness.ALIVE


def test_newer_incarnation_wins_over_higher_version() -> None:
    old = NodeState(node_id="x", incarnation=1, version=99)
    new = NodeState(node_id="x", incarnation=2, version=0)
    assert is_newer(new, old) and not is_newer(old, new) and is_newer(old, None)


def test_suspected_node_refutes_by_bumping_incarnation() -> None:
    a = member("a")
    inc = a.local.incarnation
    a.merge(GossipMessage(sender="b", states=[], view={"a": "suspect"}), now=0.0)
    assert a.local.incarnation == inc + 1
    c = member("c")
    c.merge(GossipMessage(sender="b", states=[], view={"c": "alive"}), now=0.0)
    assert c.local.incarnation == 0


def test_a_newer_stamp_of_ourselves_makes_us_jump_past_it() -> None:
    a = member("a")
    a.merge(GossipMessage(sender="b", states=[env(NodeState(node_id="a", incarnation=5, version=3))]), 0.0)
    assert a.local.stamp() > (5, 3)


def test_update_local_bumps_version() -> None:
    a = member("a")
    a.update_local(capabilities={"gpus": 1})
    assert a.local.version == 1 and a.local.capabilities == {"gpus": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("xyz"), st.integers(0, 3), st.integers(0, 5)), max_size=20), st.randoms())
def test_merge_is_order_independent(updates: list, rnd: random.Random) -> None:
    states = [NodeState(node_id=n, incarnation=i, version=v, term=v) for n, i, v in updates]
    shuffled = states[:]
    rnd.shuffle(shuffled)
    a, b = member("a"), member("b")
    for s in states:
        a.merge_state(s, 0.0)
    for s in shuffled:
        b.merge_state(s, 0.0)
    key = lambda m: {n: r.state.stamp() for n, r in m.peers.items()}
    assert key(a) == key(b)
    for n, rec in a.peers.items():
        assert rec.state.stamp() == max(s.stamp() for s in states if s.node_id == n)


def test_choose_targets_is_bounded_and_excludes_self() -> None:
    a = member("a")
    for i in range(10):
        a.merge_state(NodeState(node_id=f"p{i}"), now=0.0)
    rng = random.Random(1)
    for _ in range(50):
        t = a.choose_targets(3, 0.5, rng)
        assert len(t) <= 3 and "a" not in t and len(set(t)) == len(t)
    # all dead: still probes one so a healed partition is found again
    assert len(a.choose_targets(3, 10.0, rng)) == 1


def simulate(n: int, fanout: int, seed: int) -> int:
    """Rounds until every node knows every other's latest stamp, starting from a ring."""
    rng = random.Random(seed)
    nodes = [member(f"n{i:03d}") for i in range(n)]
    for i, m in enumerate(nodes):
        m.merge_state(nodes[(i + 1) % n].local, 0.0)
    by_id = {m.node_id: m for m in nodes}
    for rnd in range(1, 200):
        for m in nodes:
            m.tick()
        for m in nodes:
            for t in m.choose_targets(fanout, 0.0, rng):
                other = by_id[t]
                other.merge(m.message(0.0), 0.0)
                m.merge(other.message(0.0), 0.0)
        if all(len(m.peers) == n - 1 for m in nodes):
            return rnd
    return 999


def test_push_pull_gossip_converges_in_few_rounds() -> None:
    assert simulate(40, 3, seed=7) <= 12


def test_a_relayed_incarnation_moves_by_a_bounded_step_and_the_owner_refutes_any_value() -> None:
    """Shared secret (issue 45, item 4): a relay may not push a node's incarnation far past what
    is known of it; the node itself may, and its own word replaces a forged higher one."""
    a = member("a", relay_step=64)
    a.merge(GossipMessage(sender="b", states=[env(NodeState(node_id="b", incarnation=3, version=1))]), 0.0, direct="b")
    forged = NodeState(node_id="b", incarnation=2**53, version=9, role="leader", term=2**53)
    refused: list[str] = []
    a.merge(GossipMessage(sender="m", states=[env(forged)]), 0.1, direct="m", refused=lambda n, why: refused.append(why))
    assert a.state_of("b").incarnation == 3 and refused and "only the node itself" in refused[0]  # type: ignore[union-attr]
    a.merge(GossipMessage(sender="m", states=[env(NodeState(node_id="b", incarnation=60, version=0))]), 0.2)
    assert a.state_of("b").incarnation == 60  # type: ignore[union-attr]  # a restart or two: within the step
    # a forged state that did get in (a holder of the secret speaking as b) is refuted by b itself
    a.merge(GossipMessage(sender="b", states=[env(forged)]), 0.3, direct="b")
    assert a.state_of("b").role == "leader"  # type: ignore[union-attr]
    a.merge(GossipMessage(sender="b", states=[env(NodeState(node_id="b", incarnation=61, version=2))]), 0.4,
            direct="b")
    assert a.state_of("b").stamp() == (61, 2) and a.state_of("b").role == "follower"  # type: ignore[union-attr]
    # a stranger first heard of through a relay: at most FIRST_SIGHT_MAX
    a.merge(GossipMessage(sender="m", states=[env(NodeState(node_id="c", incarnation=2**40))]), 0.5)
    assert a.state_of("c") is None


def test_a_forged_state_of_ourselves_cannot_push_us_to_the_bound() -> None:
    a = member("a", relay_step=64)
    a.merge(GossipMessage(sender="m", states=[env(NodeState(node_id="a", incarnation=2**53 - 1, version=5))]), 0.0)
    assert a.local.incarnation < 1000  # ignored: refutation must stay possible
    a.merge(GossipMessage(sender="m", states=[env(NodeState(node_id="a", incarnation=57, version=5))]), 0.0)
    assert a.local.stamp() == (58, 0)  # our own old state (we restarted without our file): jump past it
    signed = member("s")  # per-node keys: every state that got in carries its owner's signature
    signed.merge(GossipMessage(sender="m", states=[env(NodeState(node_id="s", incarnation=2**40, version=1))]), 0.0)
    assert signed.local.incarnation == 2**40 + 1
