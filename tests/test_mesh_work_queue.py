"""The leader's work queue on a real SQLite file, and its pure token rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.p2p.schemas import ClaimInfo, Completion, Token
from app.coordination.p2p.work_queue import CLAIM_PAGE, IN_CHUNK, WorkQueue
from app.coordination.p2p.work_rules import (
    TRAINING_KIND,
    WorkSpec,
    fits,
    state_after_lapse,
    token_refusal,
)

pytestmark = pytest.mark.timeout(60)

SPECS = [WorkSpec("demo", "a"), WorkSpec("demo", "b"), WorkSpec(TRAINING_KIND, "gen1", {"gen": 1})]


def done_by(node: str, iid: str, token: Token) -> Completion:
    """A completion record as the queue keeps it (its signature is checked at the edge: completions.py)."""
    return Completion(node_id=node, item_id=iid, token=token, digest="0" * 64, sig="s")


@pytest.fixture
def queue(db_target):  # type: ignore[no-untyped-def]  # SQLite, then PostgreSQL (tests/db_backends.py)
    q = WorkQueue(db_target, max_attempts=2, default_ttl=10.0)
    q.rebuild(1, SPECS, [], now=0.0)
    yield q
    q.close()


def test_claim_renew_complete_and_stale_tokens(queue: WorkQueue) -> None:
    g = queue.claim("w1", {}, None, term=1, now=1.0)
    assert g is not None and g.token == Token(term=1, seq=1) and g.ttl == 10.0 and g.item.attempts == 1
    iid = g.item.item_id
    assert queue.renew("w1", iid, g.token, 1, True, 5.0) == (None, 10.0)
    assert queue.renew("w2", iid, g.token, 1, True, 5.0)[0] == "claim held by another node"
    assert queue.renew("w1", iid, Token(term=1, seq=99), 1, True, 5.0)[0].startswith("stale token")
    assert queue.finish("w1", iid, Token(term=0, seq=1), 1, True, 6.0, ok=True, completion=done_by("w1", iid, Token(term=0, seq=1))).startswith("stale term")
    assert queue.finish("w1", iid, g.token, 1, False, 6.0, ok=True, completion=done_by("w1", iid, g.token)).startswith("not the leader")
    assert queue.finish("w1", iid, g.token, 1, True, 6.0, ok=True, completion=done_by("w1", iid, g.token)) is None
    assert queue.finish("w1", iid, g.token, 1, True, 6.0, ok=True, completion=done_by("w1", iid, g.token)) is not None  # twice: stale
    assert queue.summary()["done"] == 1
    assert queue.recently_completed() == [iid]
    assert queue.recent_completions() == [done_by("w1", iid, g.token)]  # what the leader gossips
    assert queue.finish("w1", iid, g.token, 1, True, 6.0, ok=True) is not None  # no completion, no done
    assert queue.finish("w1", "demo:nope", g.token, 1, True, 6.0, ok=True, completion=done_by("w1", "demo:nope", g.token)) == "unknown work item"


def test_a_gossiped_completion_marks_done_only_the_live_claim(queue: WorkQueue) -> None:
    g = queue.claim("w1", {}, ["demo"], 1, 0.0)
    assert g is not None and queue.open_items({"demo:a", "demo:b", "demo:x"}) == {"demo:a", "demo:b"}
    assert queue.admit(done_by("w2", g.item.item_id, g.token), 1, 1.0, None, True).startswith("stale token")
    assert queue.admit(done_by("w1", g.item.item_id, Token(term=1, seq=9)), 1, 1.0, None, True).startswith("stale")
    assert queue.admit(done_by("w1", g.item.item_id, g.token), 1, 1.0, None, True) is None
    assert queue.item(g.item.item_id)["state"] == "done" and queue.open_items({g.item.item_id}) == set()
    assert queue.recent_completions() == [done_by("w1", g.item.item_id, g.token)]
    assert queue.admit(done_by("w1", "demo:x", Token(term=1, seq=5)), 1, 1.0, None, True) == "not queued here"


def test_seq_increases_and_kinds_filter(queue: WorkQueue) -> None:
    t = queue.claim("w", {}, [TRAINING_KIND], 1, 0.0)
    assert t is not None and t.item.kind == TRAINING_KIND
    assert queue.claim("w", {}, [TRAINING_KIND], 1, 0.0) is None
    a = queue.claim("w", {}, None, 1, 0.0)
    b = queue.claim("w", {}, None, 1, 0.0)
    assert a and b and {a.token.seq, b.token.seq} == {2, 3}
    assert queue.claim("w", {}, None, 1, 0.0) is None


def test_expired_claim_is_reassigned_and_late_completion_refused(queue: WorkQueue) -> None:
    g1 = queue.claim("w1", {}, ["demo"], 1, 0.0)
    assert g1 is not None
    assert queue.renew("w1", g1.item.item_id, g1.token, 1, True, 10.5)[0] == "claim expired"
    g2 = queue.claim("w2", {}, ["demo"], 1, 11.0)
    assert g2 is not None and g2.item.item_id == g1.item.item_id and g2.item.attempts == 2
    assert g2.token.seq > g1.token.seq
    assert queue.finish("w1", g1.item.item_id, g1.token, 1, True, 12.0, ok=True, completion=done_by("w1", g1.item.item_id, g1.token)) is not None
    assert queue.finish("w2", g2.item.item_id, g2.token, 1, True, 12.0, ok=True, completion=done_by("w2", g2.item.item_id, g2.token)) is None


def test_seq_is_never_reused_so_an_old_token_of_the_same_worker_stays_stale(queue: WorkQueue) -> None:
    g1 = queue.claim("w1", {}, ["demo"], 1, 0.0)
    assert g1 is not None
    g2 = queue.claim("w1", {}, ["demo"], 1, 20.0)  # g1 lapsed; the same worker gets it back
    assert g2 is not None and g2.item.item_id == g1.item.item_id and g2.token.seq > g1.token.seq
    assert queue.finish("w1", g1.item.item_id, g1.token, 1, True, 21.0, ok=True, completion=done_by("w1", g1.item.item_id, g1.token)).startswith("stale token")
    assert queue.finish("w1", g2.item.item_id, g2.token, 1, True, 21.0, ok=True, completion=done_by("w1", g2.item.item_id, g2.token)) is None


def test_attempts_are_capped(queue: WorkQueue) -> None:
    for _ in range(2):
        g = queue.claim("w", {}, [TRAINING_KIND], 1, 0.0)
        assert g is not None
        assert queue.finish("w", g.item.item_id, g.token, 1, True, 1.0, ok=False, error="boom") is None
    assert queue.claim("w", {}, [TRAINING_KIND], 1, 2.0) is None
    assert queue.summary()["failed"] == 1
    assert queue.item(f"{TRAINING_KIND}:gen1")["state"] == "failed"


def test_new_term_voids_old_claims_and_folds_in_gossip(queue: WorkQueue) -> None:
    g = queue.claim("w1", {}, ["demo"], 1, 0.0)
    assert g is not None
    queue.rebuild(
        2, SPECS, in_flight=[ClaimInfo(item_id="demo:b", token=Token(term=1, seq=7), attempts=2)], now=1.0,
    )
    assert queue.finish("w1", g.item.item_id, g.token, 2, True, 1.5, ok=True, completion=done_by("w1", g.item.item_id, g.token)).startswith("stale term")
    assert queue.item("demo:a")["state"] == "pending"  # only a claimant's admitted completion marks work done
    b = queue.item("demo:b")
    assert b["state"] == "pending" and b["attempts"] == 2
    g2 = queue.claim("w2", {}, ["demo"], 2, 2.0)
    assert g2 is not None and g2.token.term == 2 and g2.item.item_id == "demo:a"  # g's claim was voided
    g3 = queue.claim("w2", {}, ["demo"], 2, 2.0)
    assert g3 is not None and g3.token.term == 2 and g3.item.item_id == "demo:b" and g3.item.attempts == 3


def test_reconcile_adds_wanted_and_drops_unwanted_pending(queue: WorkQueue) -> None:
    queue.reconcile([WorkSpec("demo", "a"), WorkSpec("demo", "c")], now=1.0)
    assert queue.item("demo:b") is None and queue.item("demo:c")["state"] == "pending"
    queue.reconcile(None, now=2.0)  # no source: nothing pruned
    assert queue.item("demo:c") is not None


def test_a_finished_item_whose_result_went_with_its_dead_finisher_is_queued_again(queue: WorkQueue) -> None:
    """A gauntlet shard's tally lives in its finisher's gossip: the leader that played it and
    was killed a second later took it along, and its completion kept the item done for good
    (the claimant waited `shard_wait_s` to play it itself). Still wanted, its finisher gone:
    queued again. Alive, or a kind whose result is not in gossip: it stays done."""
    shard, other = WorkSpec("gauntlet", "g2-anchor-0", reopen_when_finisher_gone=True), WorkSpec("demo", "z")
    queue.reconcile([shard, other], now=1.0)
    for spec in (shard, other):
        g = queue.claim("n2", {}, [spec.kind], 1, 1.0)
        assert g is not None and g.item.item_id == spec.item_id
        assert queue.finish("n2", spec.item_id, g.token, 1, True, 2.0, ok=True,
                            completion=done_by("n2", spec.item_id, g.token)) is None
    assert queue.reconcile([shard, other], now=3.0, alive={"n0", "n1", "n2"}) == []
    assert queue.item(shard.item_id)["state"] == "done"
    assert queue.reconcile([other], now=4.0, alive={"n0", "n1"}) == []  # no longer wanted: nothing to redo
    assert queue.reconcile([shard, other], now=5.0, alive={"n0", "n1"}) == [shard.item_id]
    assert queue.item(shard.item_id)["state"] == "pending" and queue.item(other.item_id)["state"] == "done"
    g = queue.claim("n1", {}, ["gauntlet"], 2, 6.0)
    assert g is not None and g.item.item_id == shard.item_id  # another node plays it


def test_requirements_must_fit(tmp_path: Path) -> None:
    q = WorkQueue(tmp_path / "r.db", 3, 5.0)
    try:
        q.rebuild(1, [WorkSpec("train", "x", requirements={"needs_gpu": True, "min_memory_gb": 8})], [], 0.0)
        assert q.claim("cpu", {"gpus": 0, "memory_gb": 64}, None, 1, 0.0) is None
        assert q.claim("small", {"gpus": 1, "memory_gb": 4}, None, 1, 0.0) is None
        assert q.claim("gpu", {"gpus": 1, "memory_gb": 16}, None, 1, 0.0) is not None
    finally:
        q.close()


def test_a_claim_reads_on_past_pages_of_items_that_do_not_fit(db_target) -> None:  # type: ignore[no-untyped-def]
    """Claims read candidates a page at a time in claim order; the one that fits may be pages down."""
    gpu_only = [WorkSpec("demo", f"gpu{i:03d}", requirements={"needs_gpu": True}, priority=1)
                for i in range(2 * CLAIM_PAGE + 5)]
    q = WorkQueue(db_target, 3, 5.0)
    try:
        q.rebuild(1, [*gpu_only, WorkSpec("demo", "cpu", priority=0)], [], 0.0)
        grant = q.claim("cpu-node", {"gpus": 0}, None, 1, 0.0)
        assert grant is not None and grant.item.item_id == "demo:cpu"
        assert q.claim("cpu-node", {"gpus": 0}, None, 1, 0.0) is None  # every page read, none fits
        grant = q.claim("gpu-node", {"gpus": 1}, None, 1, 0.0)
        assert grant is not None and grant.item.item_id == "demo:gpu000"
    finally:
        q.close()


def test_reconcile_finds_finished_items_among_many_wanted(db_target) -> None:  # type: ignore[no-untyped-def]
    """Reconcile reads only pending rows and the wanted ones (in chunks of ids): a finished item
    in the last chunk is found, stays finished and is not queued a second time."""
    specs = [WorkSpec("demo", f"k{i:05d}") for i in range(2 * IN_CHUNK + 10)]
    last = WorkSpec("demo", "k99999", priority=5)  # claimed first; sorts into the last chunk
    q = WorkQueue(db_target, 3, 5.0)
    try:
        q.rebuild(1, [*specs, last], [], 0.0)
        grant = q.claim("w", {}, None, 1, 0.0)
        assert grant is not None and grant.item.item_id == last.item_id
        assert q.finish("w", grant.item.item_id, grant.token, 1, True, 1.0, ok=True, completion=done_by("w", grant.item.item_id, grant.token)) is None
        q.reconcile([*specs, last], now=2.0)
        assert q.item(last.item_id)["state"] == "done"
        assert q.summary() == {"pending": len(specs), "claimed": 0, "done": 1, "failed": 0}
    finally:
        q.close()


def test_seq_goes_on_from_the_file_after_a_restart_in_the_same_term(db_target) -> None:  # type: ignore[no-untyped-def]
    q = WorkQueue(db_target, 3, 5.0)
    q.rebuild(1, SPECS, [], 0.0)
    first = q.claim("w1", {}, None, 1, 0.0)
    q.close()
    q = WorkQueue(db_target, 3, 5.0)  # the same leader process restarted within its term
    try:
        second = q.claim("w2", {}, None, 1, 0.0)
        assert first is not None and second is not None and second.token.seq > first.token.seq
    finally:
        q.close()


def test_an_item_waits_for_its_preferred_node_then_anyone_may_claim_it(db_target) -> None:  # type: ignore[no-untyped-def]
    q = WorkQueue(db_target, 3, 5.0)
    prefer = {"prefer_nodes": ["n1"], "prefer_s": 20.0}
    try:
        q.rebuild(1, [WorkSpec(TRAINING_KIND, key, {}, prefer, ttl=60.0) for key in ("gen2", "gen3")], [], 100.0)
        assert q.claim("n0", {}, None, 1, 110.0) is None  # within the window: only n1
        mine = q.claim("n1", {}, None, 1, 110.0)
        assert mine is not None and mine.item.key == "gen2"
        other = q.claim("n0", {}, None, 1, 120.5)  # the window is over
        assert other is not None and other.item.key == "gen3"
    finally:
        q.close()


def test_fits_and_lapse_rules() -> None:
    assert fits({}, {})
    assert not fits({"min_cpus": 4}, {"cpus": 2}) and fits({"min_cpus": 4}, {"cpus": 4})
    assert [state_after_lapse(a, 3) for a in (1, 2, 3, 4)] == ["pending", "pending", "failed", "failed"]


@settings(max_examples=400, deadline=None)
@given(
    can=st.booleans(), cur=st.integers(0, 4), tt=st.integers(0, 4), ts=st.integers(0, 4),
    state=st.sampled_from([None, "pending", "claimed", "done", "failed"]), it=st.integers(0, 4),
    iseq=st.integers(0, 4), holder=st.sampled_from(["w1", "w2"]), exp=st.one_of(st.none(), st.floats(0, 10)),
    now=st.floats(0, 10),
)
def test_token_refusal_accepts_only_the_exact_live_claim(
    can: bool, cur: int, tt: int, ts: int, state: str | None, it: int, iseq: int, holder: str,
    exp: float | None, now: float,
) -> None:
    reason = token_refusal(
        can_mutate=can, current_term=cur, token_term=tt, token_seq=ts, item_state=state, item_term=it,
        item_seq=iseq, claimed_by=holder, node_id="w1", expires_at=exp, now=now,
    )
    accepted = (can and tt == cur and state == "claimed" and it == tt and iseq == ts and holder == "w1"
                and exp is not None and now < exp)
    assert (reason is None) == accepted
