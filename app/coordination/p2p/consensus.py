"""Consensus: the election and the leader's heartbeats, on top of the shared state and the one
transition function (consensus_core.py), with decisions (deciding.py) and leadership transfer
(transfer.py) as its methods. Every rule is delegated to `election.py`; this class only keeps
the clock readings and persisted records those rules need, talks to peers, and writes history.

All methods run on one asyncio loop; after every await the term/role are re-checked, since a
message handled meanwhile may have moved the node to a newer term.
"""

from __future__ import annotations

import time

from app.coordination.p2p import election as rules
from app.coordination.p2p.deciding import Deciding
from app.coordination.p2p.election import Role
from app.coordination.p2p.quorum_cert import make_cert, signature_of, vote_text
from app.coordination.p2p.schemas import (
    MAX_TERM,
    HeartbeatRequest,
    HeartbeatResponse,
    VoterSignature,
    VoteRequest,
    VoteResponse,
)
from app.coordination.p2p.transfer import Transferring
from app.log import get_logger

log = get_logger(__name__)


class Consensus(Deciding, Transferring):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self._hb_in_flight: set[str] = set()

    def _become_leader(self, term: int, acked: set[str], sent_at: float) -> None:
        self._transition(Role.LEADER, self.node_id)
        self.ack_times = {v: sent_at for v in acked if v != self.node_id}
        self.ack_mark = self.lag.stalled
        self.last_leader_contact = time.monotonic()
        self.on_become_leader(term)

    # -- handlers (peer -> us) -------------------------------------------------------
    def handle_vote(self, sender: str, req: VoteRequest) -> VoteResponse:
        """Term first (a stale one is refused), then the sender must be the candidate; the rest is
        election.should_grant_vote. A newer term is adopted only from a configured voter."""
        if rules.term_relation(req.term, self.term) == "stale":
            return VoteResponse(term=self.term, granted=False, reason="stale term", voter_id=self.node_id)
        if sender != req.candidate_id:
            return VoteResponse(term=self.term, granted=False, voter_id=self.node_id,
                                reason=f"sent by {sender} on behalf of {req.candidate_id}")
        if req.candidate_id in self.voters and (why := self.term_check(req.term, sender)) is not None:
            return VoteResponse(term=self.term, granted=False, voter_id=self.node_id, reason=why)
        now = time.monotonic()
        if self.role is Role.LEADER:
            contact_age: float | None = 0.0
        else:
            # A voter that never heard a leader since it started counts its start as contact
            # (Raft's rule): it may have acked a leader's lease just before a restart, and a
            # vote granted at once could elect a second leader while that lease still runs.
            contact_age = self.contact_age(now)  # less our own stalls (loop_lag.py)
        decision = rules.should_grant_vote(
            candidate_id=req.candidate_id,
            candidate_term=req.term,
            candidate_rank=rules.bully_rank(req.priority, req.candidate_id),
            candidate_is_voter=req.candidate_id in self.voters and self.is_voter,
            pre_vote=req.pre_vote,
            current_term=self.term,
            voted_for=self.store.voted_for,
            leader_contact_age=contact_age,
            leaderless_for=self.contact_age(now),
            election_timeout_min=self.timing.election_timeout_min,
            alive_eligible_ranks=self._alive_eligible_ranks(now),
            bully_patience=self.timing.bully_patience,
            # a handover from the leader we follow (or were): that leader stepped down first
            transfer=req.transfer_from is not None and req.transfer_from in (self.leader_id, self.node_id),
        )
        if decision.adopt_term:
            self.observe_term(req.term, sender)
        if decision.granted and not req.pre_vote:  # persisted before the answer leaves
            self._transition(self.role, self.leader_id, term=req.term, vote=req.candidate_id)
            self.last_leader_contact = now
            self.reset_election_deadline(now)
            # the signed vote: with a majority's, the candidate's election certificate
            vote = signature_of(self.identity, vote_text(req.term, req.candidate_id), self.node_id)
            return VoteResponse(term=self.term, granted=True, reason=decision.reason, voter_id=self.node_id,
                                sig=vote.sig, cert=vote.cert)
        return VoteResponse(term=self.term, granted=decision.granted, reason=decision.reason, voter_id=self.node_id)

    def handle_heartbeat(self, sender: str, req: HeartbeatRequest) -> HeartbeatResponse:
        refusal = self.admit(req.term, sender, req.leader_id, req.election)
        if refusal is not None:
            return HeartbeatResponse(term=self.term, ok=False, node_id=self.node_id, reason=refusal)
        now = time.monotonic()
        self.last_leader_contact = now
        self.reset_election_deadline(now)
        self.membership.touch(req.leader_id, now)
        return HeartbeatResponse(term=self.term, ok=True, node_id=self.node_id)

    def _alive_eligible_ranks(self, now: float) -> list[rules.Rank]:
        alive = self.membership.alive_ids(now)
        return [self.rank_of(v) for v in self.voters if v in alive]

    # -- procedures (us -> peers) ----------------------------------------------------
    def _counted(self, term: int, pre_vote: bool, voter: str, answer: VoteResponse) -> bool:
        """A grant counts; a real vote only with the voter's valid signature for (term, us)."""
        if not answer.granted or answer.voter_id != voter:
            return False
        if pre_vote:
            return True
        if self.verify_sig(voter, vote_text(term, self.node_id), answer.sig, answer.cert):
            return True
        self.refuse(voter, "vote_unsigned", f"a granted vote in term {term} without a valid signature")
        return False

    async def _ask_votes(self, term: int, pre_vote: bool,
                         transfer_from: str | None = None) -> tuple[dict[str, VoterSignature | None], bool]:
        """(the voters that granted, us included, with their signed votes (None for pre-votes);
        whether an answer moved us to a newer term)."""
        req = VoteRequest(term=term, candidate_id=self.node_id, priority=self.priority, pre_vote=pre_vote,
                          transfer_from=transfer_from)
        calls = self.post_to_voters("/vote", req, VoteResponse)
        own = None if pre_vote else signature_of(self.identity, vote_text(term, self.node_id), self.node_id)
        granted: dict[str, VoterSignature | None] = {self.node_id: own}
        counted: dict[str, bool] = {}

        def counts(voter: str, answer: VoteResponse) -> bool:
            if voter not in counted:
                counted[voter] = self._counted(term, pre_vote, voter, answer)
            return counted[voter]

        def enough(answers: dict[str, VoteResponse]) -> bool:
            yes = set(granted) | {v for v, r in answers.items() if counts(v, r)}
            return rules.votes_won(self.voters, yes) or any(r.term > term for r in answers.values())

        answers = {v: r for v, r in (await self.gather_until(calls, enough)).items() if r.voter_id == v}
        now = time.monotonic()
        before = self.term
        for voter, answer in answers.items():
            self.membership.touch(voter, now)
            if answer.term > self.term:
                self.observe_answer(voter, answer.term)  # bounded step: a bomb in an answer is refused
        for voter, answer in answers.items():
            if counts(voter, answer):
                granted[voter] = None if pre_vote else VoterSignature(voter=voter, sig=answer.sig, cert=answer.cert)
        return granted, self.term > before

    async def run_election(self, transfer_from: str | None = None) -> bool:
        """Pre-vote, then a real vote in term+1; True when this node became leader. With
        `transfer_from` (the leader that handed over, transfer.py) the pre-vote is skipped and
        voters waive their loyalty to that leader, which has already stepped down."""
        if not self.is_voter or self.role is Role.LEADER:
            return False
        start_term = self.term
        if start_term + 1 > MAX_TERM:  # unreachable: adopted terms stop at election.TERM_CEILING
            log.critical("term at its bound: no election possible", term=start_term, bound=MAX_TERM)
            return False
        if transfer_from is None and not await self._pre_vote_won(start_term):
            return False
        term = start_term + 1
        self._transition(Role.CANDIDATE, None, term=term, vote=self.node_id)  # our own vote, persisted first
        sent_at = time.monotonic()
        granted, moved_on = await self._ask_votes(term, pre_vote=False, transfer_from=transfer_from)
        if moved_on:
            return False
        if self.term != term or self.role is not Role.CANDIDATE:
            return False
        if rules.votes_won(self.voters, granted):
            self.election_cert = make_cert("vote", term, self.node_id, [v for v in granted.values() if v is not None])
            self.note_certified(term, self.node_id)
            self._become_leader(term, set(granted), sent_at)
            return True
        self._transition(Role.FOLLOWER, None, reason="election lost")
        return False

    async def _pre_vote_won(self, start_term: int) -> bool:
        """Would we win term+1 without disturbing a live leader? Asks ourselves, then the voters."""
        now = time.monotonic()
        own = rules.should_grant_vote(
            candidate_id=self.node_id, candidate_term=start_term + 1, candidate_rank=self.rank_of(self.node_id),
            candidate_is_voter=True, pre_vote=True, current_term=start_term, voted_for=None,
            leader_contact_age=None if self.last_leader_contact is None else self.contact_age(now),
            leaderless_for=self.contact_age(now),
            election_timeout_min=self.timing.election_timeout_min,
            alive_eligible_ranks=self._alive_eligible_ranks(now), bully_patience=self.timing.bully_patience,
        )
        if not own.granted:
            return False
        granted, moved_on = await self._ask_votes(start_term + 1, pre_vote=True)
        if moved_on:
            return False
        if not rules.votes_won(self.voters, granted) or self.term != start_term or self.role is Role.LEADER:
            return False
        # a leader that showed up while we asked wins
        return self.last_leader_contact is None or self.contact_age(time.monotonic()) >= self.timing.election_timeout_min

    async def heartbeat_round(self) -> None:
        """One round of leader heartbeats to the voters and every credible peer (membership.py:
        a name that merely appeared in gossip may not exist); voter acks extend the lease."""
        if self.role is not Role.LEADER:
            return
        now = time.monotonic()
        targets = set(self.voters) | {p for p in self.membership.peers if self.membership.credible(p, now)}
        targets.discard(self.node_id)
        for peer in targets:
            if peer in self._hb_in_flight:
                continue  # the previous heartbeat is still waiting for its timeout
            addr = self.addr_of(peer)
            if not addr:
                continue
            self._hb_in_flight.add(peer)
            self.spawn(self._heartbeat_one(peer, addr, self.term))

    async def _heartbeat_one(self, peer: str, addr: str, term: int) -> None:
        try:
            sent_at = time.monotonic()
            req = HeartbeatRequest(term=term, leader_id=self.node_id, sent_at=time.time(), election=self.election_cert)
            resp = await self.client.post(addr, "/heartbeat", req, HeartbeatResponse, self.timing.request_timeout,
                                          expect=peer)
            if resp is None:
                return
            if resp.node_id != peer:
                return  # another node answers at that address now
            self.membership.touch(peer, time.monotonic())
            if resp.term > self.term:
                self.observe_answer(peer, resp.term)
            elif resp.ok and self.role is Role.LEADER and self.term == term:
                self.ack_times[peer] = max(self.ack_times.get(peer, 0.0), sent_at)
                self.ack_mark = self.lag.stalled
        finally:
            self._hb_in_flight.discard(peer)

