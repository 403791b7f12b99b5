"""No wasted round on a leader change (issue 11): a new leader adopts the live claims it learns
from gossip and hands each holder a new-term token at its next renew; an item it already gave to
another node stays refused to the old holder (409). Claim expiry runs on the leader's monotonic
clock, so the queue is driven with monotonic-like readings here."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.coordination.p2p.node import ClusterView, MeshNode
from app.coordination.p2p.schemas import ClaimInfo
from app.coordination.p2p.work_queue import WorkQueue
from app.coordination.p2p.work_rules import TRAINING_KIND, WorkSpec
from tests.mesh_helpers import assert_one_leader_per_term, free_ports, wait_for
from tests.test_mesh_work_queue import done_by

pytestmark = pytest.mark.timeout(120)
SECRET = b"handover-test-secret"
IDS = ["n0", "n1", "n2"]
SPECS = [WorkSpec(TRAINING_KIND, "gen1", ttl=30.0), WorkSpec("demo", "a")]


def source(view: ClusterView) -> list[WorkSpec]:
    return SPECS


def test_adoption_keeps_the_holder_and_never_steals_an_item_given_away(tmp_path: Path) -> None:
    q = WorkQueue(tmp_path / "q.db", max_attempts=3, default_ttl=10.0)
    try:
        q.rebuild(1, SPECS, [], now=0.0)
        g = q.claim("w1", {}, [TRAINING_KIND], term=1, now=1.0)
        assert g is not None
        held = ClaimInfo(item_id=g.item.item_id, token=g.token, attempts=1)
        # term 2: the new leader learns of w1's claim from gossip and adopts it
        q.rebuild(2, SPECS, [held], now=2.0, live=[("w1", held)])
        assert q.item(g.item.item_id)["claimed_by"] == "w1"
        reason, ttl, token = q.renew_token("w1", g.item.item_id, g.token, 2, True, 3.0)
        assert reason is None and token is not None and token.term == 2 and ttl == 30.0
        assert q.renew_token("w2", g.item.item_id, g.token, 2, True, 3.0)[0] is not None  # only its holder
        assert q.finish("w1", g.item.item_id, token, 2, True, 4.0, ok=True, completion=done_by("w1", g.item.item_id, token)) is None
        # term 3: the claim was not known at rebuild, so the item went to w2; w1's claim, learned
        # later, is not adopted and w1's renew is refused
        d = q.claim("w1", {}, ["demo"], term=2, now=5.0)
        assert d is not None
        q.rebuild(3, SPECS, [], now=6.0)
        given = q.claim("w2", {}, ["demo"], term=3, now=6.5)
        assert given is not None
        late = ClaimInfo(item_id=d.item.item_id, token=d.token, attempts=1)
        assert q.adopt(3, [("w1", late)], now=7.0) == []
        assert q.renew_token("w1", d.item.item_id, d.token, 3, True, 7.5)[0] is not None
        # an adopted claim that lapsed is not adopted again from the same stale gossip
        q.rebuild(4, SPECS, [], now=8.0)
        again = ClaimInfo(item_id=given.item.item_id, token=given.token, attempts=1)
        assert q.adopt(4, [("w2", again)], now=8.0) == [given.item.item_id]
        q.reconcile(SPECS, now=100.0)  # lapsed: 10 s TTL on the leader's clock
        assert q.adopt(4, [("w2", again)], now=100.0) == []
    finally:
        q.close()


async def test_a_new_leader_adopts_a_live_claim_and_renews_it_under_its_term(tmp_path: Path) -> None:
    ports = free_ports(3)
    nodes = [MeshNode(node_id=IDS[i], host="127.0.0.1", port=ports[i], data_dir=tmp_path / IDS[i],
                      peers=[f"{IDS[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i], voters=IDS,
                      priority=i, profile="fast", secret=SECRET, work_source=source) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        async def leader() -> MeshNode | None:
            leads = [n for n in nodes if n.is_leader and n.started]
            live = [n for n in nodes if n.started]
            return leads[0] if len(leads) == 1 and all(n.leader_id == leads[0].node_id for n in live) else None
        old = await wait_for(leader, 15.0)
        holder = next(n for n in nodes if n is not old)
        wc = holder.work_client()
        claim = await wait_for(lambda: wc.claim(training=True), 10.0)
        assert claim.token.term == old.term

        async def everyone_knows() -> bool:  # the claim is in the holder's gossiped state everywhere
            return all((st := n.membership.state_of(holder.node_id)) is not None
                       and [c.item_id for c in st.claims] == [claim.item.item_id] for n in nodes)
        await wait_for(everyone_knows, 10.0)
        await old.stop()
        rest = [n for n in nodes if n is not old]
        new = await wait_for(leader, 20.0)
        assert new is not old and new.term > claim.token.term
        assert new.queue.item(claim.item.item_id)["claimed_by"] == holder.node_id  # adopted, not re-queued

        async def renewed() -> bool:
            outcome = await wc.renew(claim)
            return outcome.ok
        await wait_for(renewed, 10.0)
        assert wc.token_of(claim).term == new.term  # the holder now carries a token of the new term
        done = await wc.complete(claim, {"loss": 0.1})
        assert done.ok, done
        assert new.queue.item(claim.item.item_id)["state"] == "done"
        assert all(n.membership.local.claims == [] for n in rest if n is holder)
    finally:
        for n in nodes:
            await n.stop()
        assert_one_leader_per_term([tmp_path / nid for nid in IDS])
