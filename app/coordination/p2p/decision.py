"""Deciding one value per key through a quorum of voters: single-decree Paxos with terms as ballots.

Storing a value on a quorum is not enough on its own: a leader that stored A on a minority and
then lost its quorum leaves A behind on those voters, and a later leader that never saw A could
get B stored on the rest. So a voter remembers the term each value was stored in, and a leader:

  1. reads the key from a quorum of voters in its term (the votes that elected it already
     promised to refuse lower terms: this read is Paxos's phase 1);
  2. proposes the value stored in the highest term it read, or its own when none was found,
     and has a quorum store it in its term (phase 2).

Whatever a quorum stored in some term is then in every later quorum read, so it is the value
every later leader proposes: a key is decided once and never changes. A value stored by fewer
than a quorum is tentative: a later term may replace it. Only decided values may be acted on:
the leader learns them from `decide`'s return value and tells the voters (`/commit/decided`),
which mark them in their store; a value merely stored is never acted on.
The rules are the pure functions here; `decide` is the I/O around them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.coordination.p2p import election as rules
from app.coordination.p2p.schemas import CommitReadRequest, CommitReadResponse, CommitRequest, CommitResponse

if TYPE_CHECKING:
    from app.coordination.p2p.consensus import Consensus


@dataclass(frozen=True)
class Stored:
    """A value as a voter holds it: with the term of the leader that had it stored."""

    value: str
    term: int


def may_store(existing: Stored | None, value: str, term: int) -> tuple[bool, str]:
    """Whether a voter stores `value` from a leader of `term` (already checked not stale)."""
    if existing is None or existing.value == value:
        return True, "stored"
    if term > existing.term:  # that leader read a quorum first: `existing` was never decided
        return True, f"replaced a value stored in term {existing.term} that no quorum decided"
    return False, f"a different value is stored for this key in term {existing.term}"


def choose_value(read: Iterable[Stored | None], proposal: str | None) -> str | None:
    """Phase 1's outcome: the value stored in the highest term, else the leader's own proposal."""
    highest = max((s for s in read if s is not None), key=lambda s: s.term, default=None)
    return highest.value if highest is not None else proposal


async def decide(consensus: "Consensus", key: str, proposal: str | None) -> str | None:
    """Leader only: the value decided for `key` (ours, or one decided or half-stored before),
    or None when there is no quorum, a newer term appeared, or nothing was ever proposed."""
    c = consensus
    if not c.can_mutate():
        return None
    term = c.term
    read: dict[str, Stored | None] = {}
    if c.is_voter:
        read[c.node_id] = c.commits.get_stored(key)
    req = CommitReadRequest(term=term, leader_id=c.node_id, key=key)
    calls = c.post_to_voters("/commit/read", req, CommitReadResponse)

    def enough(answers: dict[str, CommitReadResponse]) -> bool:
        return rules.votes_won(c.voters, set(read) | {v for v, r in answers.items() if r.ok})

    answers = await c.gather_until(calls, enough)
    for r in answers.values():
        c.observe_term(r.term)
    read.update({v: None if r.value is None else Stored(r.value, r.value_term or 0)
                 for v, r in answers.items() if r.ok})
    if c.term != term or not rules.votes_won(c.voters, set(read)):
        return None
    value = choose_value(read.values(), proposal)
    if value is None:
        return None
    if not await store_on_quorum(c, key, value, term):
        return None
    announce_decided(c, key, value, term)
    return value


def announce_decided(c: "Consensus", key: str, value: str, term: int) -> None:
    """Paxos's learn step: voters mark the value decided (they act on it at once, rather than
    when gossip brings it); a lost message only delays them until that gossip."""
    if c.is_voter:
        c.commits.mark_decided(key, value)
    req = CommitRequest(term=term, leader_id=c.node_id, key=key, value=value)
    for call in c.post_to_voters("/commit/decided", req, CommitResponse).values():
        c.spawn(call)


# -- leader: phase 2 ---------------------------------------------------------------------
async def store_on_quorum(c: "Consensus", key: str, value: str, term: int) -> bool:
    """Phase 2: store `value` under `key` on a quorum of voters in `term` (this node included
    when it is a voter); True only when a quorum stored it and we still lead that term."""
    if not c.can_mutate() or c.term != term:
        return False
    granted: set[str] = set()
    if c.is_voter:
        if not c.commits.store(key, value, term)[0]:
            return False
        granted.add(c.node_id)
    req = CommitRequest(term=term, leader_id=c.node_id, key=key, value=value)

    def enough(answers: dict[str, CommitResponse]) -> bool:
        return rules.votes_won(c.voters, granted | {v for v, r in answers.items() if r.stored})

    answers = await c.gather_until(c.post_to_voters("/commit", req, CommitResponse), enough)
    for r in answers.values():
        c.observe_term(r.term)
    stored = granted | {v for v, r in answers.items() if r.stored}
    return c.term == term and rules.votes_won(c.voters, stored)


# -- voter side ----------------------------------------------------------------------------
def _stale(c: "Consensus", term: int, leader_id: str) -> bool:
    """A request from an older term is refused; a newer term is adopted (we follow its leader)."""
    if rules.term_relation(term, c.term) == "stale":
        return True
    c.observe_term(term, leader_id)
    return False


def handle_read(c: "Consensus", req: CommitReadRequest) -> CommitReadResponse:
    """Phase 1: adopting the reader's term promises to refuse older leaders from now on."""
    if _stale(c, req.term, req.leader_id):
        return CommitReadResponse(term=c.term, ok=False)
    stored = c.commits.get_stored(req.key)
    return CommitReadResponse(term=c.term, ok=True, value=stored.value if stored else None,
                              value_term=stored.term if stored else None)


def handle_store(c: "Consensus", req: CommitRequest) -> CommitResponse:
    """Phase 2: store unless a value of this same term differs (may_store)."""
    if _stale(c, req.term, req.leader_id):
        return CommitResponse(term=c.term, stored=False, reason="stale term")
    stored, why = c.commits.store(req.key, req.value, req.term)
    return CommitResponse(term=c.term, stored=stored, reason="" if stored else why)


def handle_decided(c: "Consensus", req: CommitRequest) -> CommitResponse:
    """The learn step: a leader's quorum stored (key, value); marked if it is what we hold."""
    if _stale(c, req.term, req.leader_id):
        return CommitResponse(term=c.term, stored=False, reason="stale term")
    marked = c.commits.mark_decided(req.key, req.value)
    return CommitResponse(term=c.term, stored=marked, reason="" if marked else "not the value stored here")
