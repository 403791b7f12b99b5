"""Election, quorum and term rules: exhaustive over small clusters, hypothesis beyond."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.config.mesh import PROFILES, TimingProfile
from app.coordination.p2p import election as rules
from app.coordination.p2p.election import QuorumLevel, Role

pytestmark = pytest.mark.timeout(120)


def ids(n: int) -> list[str]:
    return [f"n{i}" for i in range(n)]


def test_quorum_size_is_majority_of_configured_voters() -> None:
    assert [rules.quorum_size(ids(v)) for v in range(1, 10)] == [1, 2, 2, 3, 3, 4, 4, 5, 5]
    assert rules.quorum_size(["a", "a", "b"]) == 2  # duplicates count once


@pytest.mark.parametrize("v", range(1, 8))
def test_quorum_level_every_subset(v: int) -> None:
    voters = ids(v)
    need = v // 2 + 1
    for k in range(v + 1):
        for alive in itertools.combinations(voters, k):
            level = rules.quorum_level(voters, list(alive) + ["not-a-voter"])
            if k == v:
                assert level is QuorumLevel.HEALTHY
            elif k >= need + 1:
                assert level is QuorumLevel.DEGRADED
            elif k == need:
                assert level is QuorumLevel.MINIMUM
            else:
                assert level is QuorumLevel.LOST
            assert rules.can_mutate(level) == (k >= need)


@pytest.mark.parametrize("v", range(1, 8))
def test_two_disjoint_sides_never_both_have_quorum(v: int) -> None:
    voters = ids(v)
    for mask in itertools.product([0, 1, 2], repeat=v):  # side A, side B, or down
        a = [x for x, m in zip(voters, mask) if m == 0]
        b = [x for x, m in zip(voters, mask) if m == 1]
        assert not (rules.votes_won(voters, a) and rules.votes_won(voters, b))


def test_no_voters_is_lost() -> None:
    assert rules.quorum_level([], ["x"]) is QuorumLevel.LOST


def test_bully_rank_orders_priority_then_id() -> None:
    assert rules.bully_rank(2, "a") > rules.bully_rank(1, "z")
    assert rules.bully_rank(1, "b") > rules.bully_rank(1, "a")
    ranks = {n: rules.bully_rank(p, n) for n, p in [("a", 0), ("b", 5), ("c", 0)]}
    assert [rules.rank_position(n, ranks) for n in "abc"] == [2, 0, 1]


@given(st.integers(0, 20), st.floats(0, 1))
def test_lower_ranked_nodes_wait_longer(pos: int, r: float) -> None:
    t = PROFILES["lan"]
    here = rules.election_timeout(t.election_timeout_min, t.election_timeout_spread, t.rank_step, pos, r)
    assert here >= t.election_timeout_min + pos * t.rank_step
    assert here < rules.election_timeout(
        t.election_timeout_min, t.election_timeout_spread, t.rank_step, pos + 1, r
    ) + t.election_timeout_spread


def grant(**overrides: object) -> rules.VoteDecision:
    base: dict = dict(
        candidate_id="b", candidate_term=5, candidate_rank=(0, "b"), candidate_is_voter=True,
        pre_vote=False, current_term=4, voted_for=None, leader_contact_age=None,
        leaderless_for=100.0, election_timeout_min=1.0, alive_eligible_ranks=[(0, "a"), (0, "b")],
        bully_patience=3.0,
    )
    base.update(overrides)
    return rules.should_grant_vote(**base)


def test_vote_rules_by_example() -> None:
    assert grant().granted and grant().adopt_term
    assert not grant(candidate_term=3).granted  # lower term refused
    assert not grant(candidate_is_voter=False).granted
    assert not grant(leader_contact_age=0.5).granted  # sticky to a live leader
    assert grant(leader_contact_age=1.5).granted
    # A higher-ranked node is alive and we have not been leaderless for long: prefer it.
    higher = grant(alive_eligible_ranks=[(9, "z")], leaderless_for=1.0)
    assert not higher.granted and higher.adopt_term
    assert grant(alive_eligible_ranks=[(9, "z")], leaderless_for=5.0).granted  # patience ran out
    same_term = dict(candidate_term=4, current_term=4)
    assert not grant(**same_term, voted_for="c").granted  # one vote per term
    assert grant(**same_term, voted_for="b").granted  # the same candidate may ask again
    assert not grant(**same_term, pre_vote=True).granted  # pre-vote needs a newer term
    pre = grant(pre_vote=True)
    assert pre.granted and not pre.adopt_term  # pre-votes change nothing
    # a handover from our leader waives loyalty to it and the bully preference, not the term rules
    assert grant(leader_contact_age=0.1, transfer=True).granted
    assert grant(alive_eligible_ranks=[(9, "z")], leaderless_for=0.0, transfer=True).granted
    assert not grant(leader_contact_age=0.1, transfer=True, candidate_term=3).granted
    assert not grant(**same_term, voted_for="c", transfer=True).granted


def test_transfer_refusals() -> None:
    from app.coordination.p2p.transfer import transfer_refusal
    voters, alive = ["a", "b", "c"], ["a", "b"]
    assert transfer_refusal(True, "a", "b", voters, alive) is None
    assert transfer_refusal(False, "a", "b", voters, alive) == "not the leader"
    assert "already the leader" in transfer_refusal(True, "a", "a", voters, alive)
    assert "not a voter" in transfer_refusal(True, "a", "x", voters, alive + ["x"])
    assert "not alive" in transfer_refusal(True, "a", "c", voters, alive)


vote_inputs = st.fixed_dictionaries({
    "candidate_id": st.sampled_from(["a", "b", "c"]),
    "candidate_term": st.integers(0, 6),
    "candidate_rank": st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "c"])),
    "candidate_is_voter": st.booleans(),
    "pre_vote": st.booleans(),
    "current_term": st.integers(0, 6),
    "voted_for": st.sampled_from([None, "a", "b", "c"]),
    "leader_contact_age": st.one_of(st.none(), st.floats(0, 10)),
    "leaderless_for": st.floats(0, 10),
    "election_timeout_min": st.floats(0.1, 5),
    "alive_eligible_ranks": st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["a", "b", "c"])), max_size=4),
    "bully_patience": st.floats(0, 10),
    "transfer": st.booleans(),
})


@settings(max_examples=600, deadline=None)
@given(vote_inputs)
def test_vote_invariants(kw: dict) -> None:
    d = rules.should_grant_vote(**kw)
    if kw["candidate_term"] < kw["current_term"] or not kw["candidate_is_voter"]:
        assert not d.granted and not d.adopt_term
    if kw["pre_vote"]:
        assert not d.adopt_term
        if kw["candidate_term"] <= kw["current_term"]:
            assert not d.granted
    if kw["leader_contact_age"] is not None and kw["leader_contact_age"] < kw["election_timeout_min"] \
            and not kw["transfer"]:
        assert not d.granted and not d.adopt_term
    if d.granted and kw["leaderless_for"] < kw["bully_patience"] and not kw["transfer"]:
        assert not any(r > kw["candidate_rank"] for r in kw["alive_eligible_ranks"])
    if d.granted and not kw["pre_vote"] and kw["candidate_term"] == kw["current_term"]:
        assert kw["voted_for"] in (None, kw["candidate_id"])
    if d.adopt_term:
        assert kw["candidate_term"] > kw["current_term"]


@dataclass
class SimVoter:
    term: int = 0
    voted_for: str | None = None
    granted: dict[int, set[str]] = field(default_factory=dict)


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 7),
    rounds=st.lists(
        st.tuples(st.integers(0, 6), st.integers(-1, 2), st.lists(st.booleans(), min_size=7, max_size=7),
                  st.booleans()),
        min_size=1, max_size=25,
    ),
)
def test_never_two_leaders_in_one_term(n: int, rounds: list) -> None:
    """Candidates in random terms reach random subsets of voters (partitions, drops); voters
    apply the pure rule with persisted (term, voted_for). No term may have two winners."""
    voters = ids(n)
    state = {v: SimVoter() for v in voters}
    winners: dict[int, set[str]] = {}
    for cand_idx, term_delta, reach, transfer in rounds:
        cand = voters[cand_idx % n]
        term = state[cand].term + 1 + max(0, term_delta)  # always above its own term
        state[cand].term, state[cand].voted_for = term, cand
        yes = {cand}
        for i, v in enumerate(voters):
            if v == cand or not reach[i]:
                continue
            s = state[v]
            d = rules.should_grant_vote(
                candidate_id=cand, candidate_term=term, candidate_rank=(0, cand), candidate_is_voter=True,
                pre_vote=False, current_term=s.term, voted_for=s.voted_for, leader_contact_age=None,
                leaderless_for=100.0, election_timeout_min=1.0, alive_eligible_ranks=[], bully_patience=0.0,
                transfer=transfer,  # a handover waives loyalty, never the one vote per term
            )
            if d.adopt_term:
                s.term, s.voted_for = term, None
            if d.granted:
                s.voted_for = cand
                yes.add(v)
        if rules.votes_won(voters, yes):
            winners.setdefault(term, set()).add(cand)
    assert all(len(w) == 1 for w in winners.values()), winners


def test_minority_side_of_a_4_3_partition_cannot_win() -> None:
    voters = ids(7)
    assert rules.votes_won(voters, voters[:4])
    assert not rules.votes_won(voters, voters[4:])
    for sides in ([voters[:3], voters[3:6], voters[6:]],):  # 3|3|1: nobody
        assert not any(rules.votes_won(voters, side) for side in sides)


def test_quorum_ack_time_and_lease() -> None:
    voters = ids(5)
    acks = {"n1": 10.0, "n2": 8.0, "n3": 3.0}
    # self at now=12, then 10, 8: the 3rd most recent of a quorum of 3 is 8.
    assert rules.quorum_ack_time(voters, acks, "n0", 12.0) == 8.0
    assert rules.lease_deadline(voters, acks, "n0", 12.0, 1.5) == 9.5
    assert rules.quorum_ack_time(voters, {"n1": 1.0}, "n0", 12.0) is None
    assert rules.quorum_ack_time(["solo"], {}, "solo", 7.0) == 7.0
    # a non-voter leader does not count itself
    assert rules.quorum_ack_time(["a", "b", "c"], {"a": 1.0}, "x", 9.0) is None


@given(st.dictionaries(st.sampled_from(ids(7)), st.floats(0, 100), max_size=7), st.floats(100, 200))
def test_lease_needs_a_quorum_of_acks(acks: dict, now: float) -> None:
    voters = ids(7)
    t = rules.quorum_ack_time(voters, acks, "n0", now)
    counted = {**acks, "n0": now}
    if t is None:
        assert len(counted) < 4
    else:
        assert sum(1 for v in voters if counted.get(v, -1) >= t) >= 4


@pytest.mark.parametrize("role", list(Role))
def test_decide_step_down(role: Role) -> None:
    for lease_until, now, higher in itertools.product([None, 5.0], [4.0, 5.0, 6.0], [False, True]):
        out = rules.decide_step_down(role, lease_until, now, higher)
        if role is not Role.LEADER:
            assert out is False
        else:
            assert out == (higher or lease_until is None or now >= lease_until)


def test_term_relation() -> None:
    assert [rules.term_relation(m, 5) for m in (4, 5, 6)] == ["stale", "current", "newer"]


def test_profiles_keep_lease_shorter_than_election_timeout() -> None:
    # The validator is what keeps every profile safe (a profile cannot even be built otherwise):
    # prove it at each named profile's boundary, where a lease equal to the timeout is refused.
    for name, p in PROFILES.items():
        with pytest.raises(ValueError, match="leader_lease"):
            TimingProfile(**{**p.model_dump(), "leader_lease": p.election_timeout_min})
        assert TimingProfile(**p.model_dump()) == p, name
    assert PROFILES["lan"].suspect_after <= 3.0 and PROFILES["wan"].suspect_after <= 10.0
    with pytest.raises(ValueError, match="leader_lease"):
        TimingProfile(**{**PROFILES["fast"].model_dump(), "leader_lease": 5.0})
