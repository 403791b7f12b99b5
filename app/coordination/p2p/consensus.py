"""Terms, votes, leader heartbeats, the lease, and commit-through-quorum: the election's
imperative shell. Every decision is delegated to `election.py`; this class only keeps the
clock readings and persisted records those rules need, talks to peers, and writes history.

All methods run on one asyncio loop; after every await the term/role are re-checked, since a
message handled meanwhile may have moved the node to a newer term.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from pydantic import BaseModel

from app.config.mesh import TimingProfile
from app.coordination.p2p import election as rules
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.election import QuorumLevel, Role
from app.coordination.p2p.membership import Membership
from app.coordination.p2p.persist import CommitStore, HistoryLog, TermStore
from app.coordination.p2p.schemas import (
    HeartbeatRequest,
    HeartbeatResponse,
    VoteRequest,
    VoteResponse,
)
from app.log import bind_term, get_logger

log = get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)


class Consensus:
    def __init__(
        self,
        node_id: str,
        voters: list[str],
        priority: int,
        timing: TimingProfile,
        store: TermStore,
        commits: CommitStore,
        history: HistoryLog,
        membership: Membership,
        client: MeshClient,
        addr_of: Callable[[str], str | None],
        on_become_leader: Callable[[int], None],
    ) -> None:
        self.node_id = node_id
        self.voters = sorted(set(voters))
        self.priority = priority
        self.timing = timing
        self.store = store
        self.commits = commits
        self.history = history
        self.membership = membership
        self.client = client
        self.addr_of = addr_of
        self.on_become_leader = on_become_leader
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.started_at = time.monotonic()
        self.last_leader_contact: float | None = None
        self.ack_times: dict[str, float] = {}
        self.rng = random.Random()
        self.election_deadline = 0.0
        self.reset_election_deadline(time.monotonic())
        self._hb_in_flight: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        bind_term(self.term)

    # -- reading ---------------------------------------------------------------------
    @property
    def term(self) -> int:
        return self.store.term

    @property
    def is_voter(self) -> bool:
        return self.node_id in self.voters

    def rank_of(self, node_id: str) -> rules.Rank:
        if node_id == self.node_id:
            return rules.bully_rank(self.priority, node_id)
        state = self.membership.state_of(node_id)
        return rules.bully_rank(state.priority if state else 0, node_id)

    def quorum_level(self, now: float | None = None) -> QuorumLevel:
        now = time.monotonic() if now is None else now
        return rules.quorum_level(self.voters, self.membership.alive_ids(now))

    def lease_until(self, now: float) -> float | None:
        return rules.lease_deadline(self.voters, self.ack_times, self.node_id, now, self.timing.leader_lease)

    def lease_valid(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        until = self.lease_until(now)
        return self.role is Role.LEADER and until is not None and now < until

    def can_mutate(self) -> bool:
        """Leader, inside its lease, and the quorum is not LOST: the only state that writes."""
        now = time.monotonic()
        if not self.lease_valid(now):
            self.check_step_down(now)
            return False
        return rules.can_mutate(self.quorum_level(now))

    # -- state transitions -----------------------------------------------------------
    def reset_election_deadline(self, now: float) -> None:
        ranks = {v: self.rank_of(v) for v in self.voters}
        ranks.setdefault(self.node_id, self.rank_of(self.node_id))
        timeout = rules.election_timeout(
            self.timing.election_timeout_min,
            self.timing.election_timeout_spread,
            self.timing.rank_step,
            rules.rank_position(self.node_id, ranks),
            self.rng.random(),
        )
        self.election_deadline = now + timeout

    def observe_term(self, term: int, leader: str | None = None) -> None:
        """Any message carrying a newer term: persist it and become a follower."""
        if term <= self.term:
            return
        was_leader = self.role is Role.LEADER
        self.store.save(term, None)
        bind_term(term)
        self.role = Role.FOLLOWER
        self.leader_id = leader
        self.ack_times = {}
        self.history.append("term_adopted", term, leader=leader, was_leader=was_leader)
        if was_leader:
            self.history.append("stepped_down", term, reason="higher term")
            log.info("stepped down: higher term", term=term)

    def step_down(self, reason: str) -> None:
        if self.role is Role.LEADER:
            self.history.append("stepped_down", self.term, reason=reason)
            log.warning("stepped down", reason=reason)
        self.role = Role.FOLLOWER
        self.leader_id = None
        self.ack_times = {}
        self.reset_election_deadline(time.monotonic())

    def check_step_down(self, now: float) -> None:
        if rules.decide_step_down(self.role, self.lease_until(now), now, False):
            self.step_down("lease expired without quorum acks (check-quorum)")

    def _become_leader(self, term: int, acked: Iterable[str], sent_at: float) -> None:
        self.role = Role.LEADER
        self.leader_id = self.node_id
        self.ack_times = {v: sent_at for v in acked if v != self.node_id}
        self.last_leader_contact = time.monotonic()
        self.history.append("became_leader", term)
        log.info("became leader", term=term)
        self.on_become_leader(term)

    # -- handlers (peer -> us) -------------------------------------------------------
    def handle_vote(self, req: VoteRequest) -> VoteResponse:
        now = time.monotonic()
        if self.role is Role.LEADER:
            contact_age: float | None = 0.0
        else:
            # A voter that never heard a leader since it started counts its start as contact
            # (Raft's rule): it may have acked a leader's lease just before a restart, and a
            # vote granted at once could elect a second leader while that lease still runs.
            contact_age = now - (self.started_at if self.last_leader_contact is None else self.last_leader_contact)
        decision = rules.should_grant_vote(
            candidate_id=req.candidate_id,
            candidate_term=req.term,
            candidate_rank=rules.bully_rank(req.priority, req.candidate_id),
            candidate_is_voter=req.candidate_id in self.voters and self.is_voter,
            pre_vote=req.pre_vote,
            current_term=self.term,
            voted_for=self.store.voted_for,
            leader_contact_age=contact_age,
            leaderless_for=now - (self.last_leader_contact or self.started_at),
            election_timeout_min=self.timing.election_timeout_min,
            alive_eligible_ranks=self._alive_eligible_ranks(now),
            bully_patience=self.timing.bully_patience,
            # a handover from the leader we follow (or were): that leader stepped down first
            transfer=req.transfer_from is not None and req.transfer_from in (self.leader_id, self.node_id),
        )
        if decision.adopt_term:
            self.observe_term(req.term)
        if decision.granted and not req.pre_vote:
            self.store.save(req.term, req.candidate_id)  # persisted before the answer leaves
            self.last_leader_contact = now
            self.reset_election_deadline(now)
        return VoteResponse(term=self.term, granted=decision.granted, reason=decision.reason, voter_id=self.node_id)

    def handle_heartbeat(self, req: HeartbeatRequest) -> HeartbeatResponse:
        if rules.term_relation(req.term, self.term) == "stale":
            return HeartbeatResponse(term=self.term, ok=False, node_id=self.node_id)
        self.observe_term(req.term, req.leader_id)
        now = time.monotonic()
        if self.role is Role.LEADER and req.leader_id != self.node_id:
            # Two leaders in one term would be a bug in the rules; refuse loudly.
            log.error("heartbeat from another leader in my term", other=req.leader_id)
            return HeartbeatResponse(term=self.term, ok=False, node_id=self.node_id)
        self.role = Role.FOLLOWER
        if self.leader_id != req.leader_id:
            self.leader_id = req.leader_id
            self.history.append("leader_observed", self.term, leader=req.leader_id)
        self.last_leader_contact = now
        self.reset_election_deadline(now)
        self.membership.touch(req.leader_id, now)
        return HeartbeatResponse(term=self.term, ok=True, node_id=self.node_id)

    def _alive_eligible_ranks(self, now: float) -> list[rules.Rank]:
        alive = self.membership.alive_ids(now)
        return [self.rank_of(v) for v in self.voters if v in alive]

    # -- procedures (us -> peers) ----------------------------------------------------
    async def gather_until(
        self, calls: dict[str, Awaitable[T | None]], enough: Callable[[dict[str, T]], bool]
    ) -> dict[str, T]:
        """Answers as they come; stop waiting once `enough` says so (a dead peer's timeout
        must not delay an election that a quorum already decided)."""
        tasks = {asyncio.ensure_future(c): peer for peer, c in calls.items()}
        answers: dict[str, T] = {}
        try:
            pending = set(tasks)
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    result = task.result()
                    if result is not None:
                        answers[tasks[task]] = result
                if enough(answers):
                    break
        finally:
            for task in tasks:
                task.cancel()
        return answers

    def post_to_voters(self, path: str, req: BaseModel, response: type[R]) -> dict[str, Awaitable[R | None]]:
        """One request to every other voter with a known address (None answers: unreachable)."""
        calls = {}
        for voter in self.voters:
            addr = self.addr_of(voter) if voter != self.node_id else None
            if addr:
                calls[voter] = self.client.post(addr, path, req, response, self.timing.request_timeout)
        return calls

    async def _ask_votes(self, term: int, pre_vote: bool, transfer_from: str | None = None) -> tuple[set[str], int]:
        req = VoteRequest(term=term, candidate_id=self.node_id, priority=self.priority, pre_vote=pre_vote,
                          transfer_from=transfer_from)
        calls = self.post_to_voters("/vote", req, VoteResponse)
        granted = {self.node_id}

        def enough(answers: dict[str, VoteResponse]) -> bool:
            yes = granted | {v for v, r in answers.items() if r.granted}
            return rules.votes_won(self.voters, yes) or any(r.term > term for r in answers.values())

        answers = await self.gather_until(calls, enough)
        now = time.monotonic()
        for voter in answers:
            self.membership.touch(voter, now)
        highest = max([r.term for r in answers.values()], default=0)
        return granted | {v for v, r in answers.items() if r.granted}, highest

    async def run_election(self, transfer_from: str | None = None) -> bool:
        """Pre-vote, then a real vote in term+1; True when this node became leader. With
        `transfer_from` (the leader that handed over, transfer.py) the pre-vote is skipped and
        voters waive their loyalty to that leader, which has already stepped down."""
        if not self.is_voter or self.role is Role.LEADER:
            return False
        start_term = self.term
        if transfer_from is None and not await self._pre_vote_won(start_term):
            return False
        term = start_term + 1
        self.store.save(term, self.node_id)  # vote for ourselves, persisted first
        bind_term(term)
        self.role, self.leader_id, self.ack_times = Role.CANDIDATE, None, {}
        self.history.append("became_candidate", term)
        sent_at = time.monotonic()
        granted, highest = await self._ask_votes(term, pre_vote=False, transfer_from=transfer_from)
        if highest > self.term:
            self.observe_term(highest)
            return False
        if self.term != term or self.role is not Role.CANDIDATE:
            return False
        if rules.votes_won(self.voters, granted):
            self._become_leader(term, granted, sent_at)
            return True
        self.role = Role.FOLLOWER
        return False

    async def _pre_vote_won(self, start_term: int) -> bool:
        """Would we win term+1 without disturbing a live leader? Asks ourselves, then the voters."""
        now = time.monotonic()
        own = rules.should_grant_vote(
            candidate_id=self.node_id, candidate_term=start_term + 1, candidate_rank=self.rank_of(self.node_id),
            candidate_is_voter=True, pre_vote=True, current_term=start_term, voted_for=None,
            leader_contact_age=None if self.last_leader_contact is None else now - self.last_leader_contact,
            leaderless_for=now - (self.last_leader_contact or self.started_at),
            election_timeout_min=self.timing.election_timeout_min,
            alive_eligible_ranks=self._alive_eligible_ranks(now), bully_patience=self.timing.bully_patience,
        )
        if not own.granted:
            return False
        granted, highest = await self._ask_votes(start_term + 1, pre_vote=True)
        if highest > self.term:
            self.observe_term(highest)
            return False
        if not rules.votes_won(self.voters, granted) or self.term != start_term or self.role is Role.LEADER:
            return False
        # a leader that showed up while we asked wins
        return self.last_leader_contact is None or time.monotonic() - self.last_leader_contact >= self.timing.election_timeout_min

    def spawn(self, coro: Awaitable[object]) -> None:
        """Run `coro` in the background; cancelled with the node (cancel_tasks)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def heartbeat_round(self) -> None:
        """One round of leader heartbeats to every known node; voter acks extend the lease."""
        if self.role is not Role.LEADER:
            return
        targets = set(self.voters) | set(self.membership.peers)
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
            req = HeartbeatRequest(term=term, leader_id=self.node_id, sent_at=time.time())
            resp = await self.client.post(addr, "/heartbeat", req, HeartbeatResponse, self.timing.request_timeout)
            if resp is None:
                return
            self.membership.touch(peer, time.monotonic())
            if resp.term > self.term:
                self.observe_term(resp.term)
            elif resp.ok and self.role is Role.LEADER and self.term == term:
                self.ack_times[peer] = max(self.ack_times.get(peer, 0.0), sent_at)
        finally:
            self._hb_in_flight.discard(peer)

    async def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
