"""Election, quorum and term rules as pure functions.

Everything that decides *who may lead* lives here so it can be tested exhaustively; the node
only gathers inputs (its persisted term, what it has heard and when) and acts on the answer.

The rules, and why:

* Quorum is a majority of the CONFIGURED voters, never of the ones that happen to be alive:
  two sides of a partition cannot both hold a majority of one fixed set, so at most one leads.
* A vote is granted at most once per term, and the term is persisted before the answer leaves.
* A voter that heard from a live leader within the election timeout refuses every candidate
  (leader stickiness): a returning higher-priority node cannot preempt a healthy leader.
* Bully order (priority, then node id) only decides whom voters *prefer* while they are
  leaderless: a voter refuses a candidate while a higher-ranked eligible node it believes alive
  exists. After `bully_patience` seconds without a leader the preference is dropped, so a
  higher-ranked node that is visible but cannot win never blocks the cluster forever.
* Candidates first run a pre-vote (the same rule, no side effects): a node cut off from a
  quorum cannot inflate its term and later disrupt a healthy leader.
* Terms move by bounded steps (`term_refusal`): a voter adopts a higher term only when it is at
  most `step` above the highest term it knows of any voter other than the sender (its own
  included), and never above TERM_CEILING. Honest terms grow by one per election, so they are
  never far apart; one message claiming a huge term is refused, counted and shown, instead of
  wedging every later election. The ceiling sits far below the wire bound MAX_TERM, so an
  election from any adoptable term still has room; a term nearing it is an operator alert.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


class QuorumLevel(str, Enum):
    HEALTHY = "healthy"  # every voter alive
    DEGRADED = "degraded"  # a majority plus at least one spare
    MINIMUM = "minimum"  # exactly a majority: one more loss and the cluster is read-only
    LOST = "lost"  # below a majority: read-only, no mutations, no promotions


Rank = tuple[int, str]
TERM_CEILING = 2**52  # highest term a voter adopts or starts with; MAX_TERM (2**53) leaves 2**52 elections above it
TERM_ALERT = 2**40  # a term this high was never reached by elections (one a second: 35,000 years): an alert


def quorum_size(voters: Iterable[str]) -> int:
    """floor(V/2)+1 of the configured voters (duplicates count once)."""
    return len(set(voters)) // 2 + 1


def quorum_level(voters: Iterable[str], alive: Iterable[str]) -> QuorumLevel:
    voter_set = set(voters)
    if not voter_set:
        return QuorumLevel.LOST
    up = len(voter_set & set(alive))
    need = quorum_size(voter_set)
    if up == len(voter_set):
        return QuorumLevel.HEALTHY
    if up >= need + 1:
        return QuorumLevel.DEGRADED
    if up == need:
        return QuorumLevel.MINIMUM
    return QuorumLevel.LOST


def can_mutate(level: QuorumLevel) -> bool:
    return level is not QuorumLevel.LOST


def bully_rank(priority: int, node_id: str) -> Rank:
    """The one preference order used everywhere: higher priority first, then higher node id."""
    return (priority, node_id)


def rank_position(node_id: str, ranks: Mapping[str, Rank]) -> int:
    """0 for the most preferred node among `ranks`, 1 for the next, ...; it scales the wait."""
    mine = ranks[node_id]
    return sum(1 for other, rank in ranks.items() if other != node_id and rank > mine)


def election_timeout(
    timeout_min: float, spread: float, rank_step: float, position: int, rand01: float
) -> float:
    """Randomised timeout; lower-ranked nodes wait longer so the preferred one usually goes first."""
    return timeout_min + position * rank_step + rand01 * spread


@dataclass(frozen=True)
class VoteDecision:
    granted: bool
    reason: str
    adopt_term: bool  # the voter must persist the candidate's term (and clear voted_for)


def should_grant_vote(
    *,
    candidate_id: str,
    candidate_term: int,
    candidate_rank: Rank,
    candidate_is_voter: bool,
    pre_vote: bool,
    current_term: int,
    voted_for: str | None,
    leader_contact_age: float | None,
    leaderless_for: float,
    election_timeout_min: float,
    alive_eligible_ranks: Iterable[Rank],
    bully_patience: float,
    transfer: bool = False,
) -> VoteDecision:
    """Whether a voter grants (pre-)vote to a candidate.

    `leader_contact_age`: seconds since this voter last heard from a leader (or granted a
    vote), None if never; `leaderless_for`: seconds since it last had a leader or started.
    `alive_eligible_ranks`: ranks of eligible nodes this voter believes ALIVE, itself included
    when it is eligible; the candidate's own rank is ignored.
    For a pre-vote `candidate_term` is the term the candidate *would* use and nothing is adopted.
    `transfer`: the leader this voter follows handed leadership to the candidate (and stepped
    down first): loyalty to it and the bully preference are waived, the term rules are not.
    """
    if not candidate_is_voter:
        return VoteDecision(False, "candidate is not an eligible voter", False)
    if pre_vote:
        if candidate_term <= current_term:
            return VoteDecision(False, "stale term", False)
    elif candidate_term < current_term:
        return VoteDecision(False, "stale term", False)
    if not transfer and leader_contact_age is not None and leader_contact_age < election_timeout_min:
        return VoteDecision(False, "a live leader was heard from recently", False)
    adopt = (not pre_vote) and candidate_term > current_term
    if not transfer and leaderless_for < bully_patience and any(
        rank > candidate_rank for rank in alive_eligible_ranks
    ):
        return VoteDecision(False, "a higher-ranked eligible node is alive", adopt)
    if not pre_vote and not adopt and voted_for not in (None, candidate_id):
        return VoteDecision(False, f"already voted for {voted_for} in this term", False)
    return VoteDecision(True, "granted", adopt)


def term_refusal(term: int, own: int, others: Iterable[int], step: int) -> str | None:
    """Why a voter at `own` must not adopt `term` (None: it may, or it is no adoption at all).
    `others`: the terms of the other voters as they gossip them, the sender's excluded."""
    if term <= own:
        return None
    if term > TERM_CEILING:
        return f"term {term} is above the ceiling {TERM_CEILING}: no election reaches it"
    reference = max([own, *others])
    if term > reference + step:
        return f"term {term} is more than {step} above every other voter's (the highest is {reference})"
    return None


def term_relation(message_term: int, current_term: int) -> str:
    """'stale' (refuse the message), 'current', or 'newer' (adopt it and step down)."""
    if message_term < current_term:
        return "stale"
    if message_term > current_term:
        return "newer"
    return "current"


def quorum_ack_time(
    voters: Iterable[str], ack_times: Mapping[str, float], self_id: str, now: float
) -> float | None:
    """The latest time by which a quorum of voters had acknowledged this leader.

    `ack_times` are the SEND times of the requests each voter acknowledged (a voter received
    them no earlier, so its own stickiness window outlasts the lease). The leader counts
    itself at `now` when it is a voter. None when fewer than a quorum ever acknowledged.
    """
    voter_set = set(voters)
    times = [now if v == self_id else ack_times[v] for v in voter_set if v == self_id or v in ack_times]
    need = quorum_size(voter_set)
    if len(times) < need:
        return None
    return sorted(times, reverse=True)[need - 1]


def lease_deadline(
    voters: Iterable[str], ack_times: Mapping[str, float], self_id: str, now: float, lease: float
) -> float | None:
    acked = quorum_ack_time(voters, ack_times, self_id, now)
    return None if acked is None else acked + lease


def decide_step_down(
    role: Role, lease_until: float | None, now: float, saw_higher_term: bool
) -> bool:
    """A leader steps down on a higher term or when its lease ran out (check-quorum)."""
    if role is not Role.LEADER:
        return False
    return saw_higher_term or lease_until is None or now >= lease_until


def votes_won(voters: Iterable[str], granted_by: Iterable[str]) -> bool:
    """Leader only with grants from floor(V/2)+1 of the configured voters."""
    voter_set = set(voters)
    return len(voter_set & set(granted_by)) >= quorum_size(voter_set)
