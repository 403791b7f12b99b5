"""The state every consensus protocol shares, and the one place it changes.

hashicorp/raft style: `_transition` is the only code that changes role, term, vote or leader;
it persists a new term or vote before anything else sees it and writes the history line.
`admit` is the one gate of every message a leader sends (heartbeat, commit read/store/decided,
timeout_now), checked in one order everywhere:

  1. a stale term is refused;
  2. the sender must be the node the message speaks for, and a configured voter;
  3. a newer term must be a bounded step above every other voter's (election.term_refusal);
  4. a leader not yet proven for that term must show its election certificate: the signed
     votes of a majority of the voters for it in that term (quorum_cert.py); a self-declared
     leader, a voter among them, is refused (`no_election_certificate`);
  5. in our own term it must be the leader we know of (a second leader of a term is refused);
  6. a newer term is adopted (persisted) and its leader followed.

A term is only ever adopted from a configured voter, through the messages that carry terms in
Raft (votes and their answers, the leader's heartbeats and commits), never from gossip, and
only by a bounded step (`term_check`): the other voters' terms as they gossip them (signed by
each owner) are the reference, so one voter, or one answer, claiming a term far ahead of all
others is refused with a reason, counted (`mesh_refusals_total{reason="term_far_ahead"}`) and
shown in /status, and never wedges the elections after it.
The protocols are subclasses: deciding.py (one value per key), transfer.py (handover),
consensus.py (election and heartbeats).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from app.config.mesh import TimingProfile
from app.coordination.p2p import election as rules
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.election import QuorumLevel, Role
from app.coordination.p2p.loop_lag import LoopLag, check_quorum_deadline, judged_age
from app.coordination.p2p.membership import Membership
from app.coordination.p2p.persist import CommitStore, HistoryLog, TermStore
from app.coordination.p2p.quorum_cert import certificate_refusal, verifier_of
from app.coordination.p2p.schemas import MAX_TERM, QuorumCert
from app.log import bind_term, get_logger

TermRefused = Callable[[str, int, str], None]  # (the voter that sent it, the term, why)
Refused = Callable[[str, str, str], None]  # (the peer, the reason's code, why)
CERTIFIED_TERMS = 64  # (term -> leader) proven by an election certificate, kept for the newest terms

log = get_logger(__name__)
T = TypeVar("T")
R = TypeVar("R", bound=BaseModel)
_KEEP = object()


class ConsensusCore:
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
        *,
        max_term_step: int = 1000,
        on_term_refused: TermRefused | None = None,
        on_refused: Refused | None = None,
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
        self.max_term_step = max_term_step
        self.on_term_refused = on_term_refused
        self.on_refused = on_refused
        self.identity = client.identity
        self.verify_sig = verifier_of(client.identity)
        self.election_cert: QuorumCert | None = None  # ours, while we lead its term
        self.certified: dict[int, str] = {}  # term -> the leader whose election certificate we checked
        self.terms_refused = 0
        self.last_term_refusal: dict[str, object] | None = None
        self.role = Role.FOLLOWER
        self.leader_id: str | None = None
        self.lag = LoopLag(tick=max(0.005, timing.heartbeat_interval / 4))  # run by the node (node.start)
        self.contact_mark = 0.0  # lag.stalled when we last heard a leader
        self.deadline_mark = 0.0  # lag.stalled when the election deadline was set
        self.ack_mark = 0.0  # lag.stalled when a voter's ack last extended the lease
        self.started_at = time.monotonic()
        self.last_leader_contact: float | None = None
        self.ack_times: dict[str, float] = {}
        self.rng = random.Random()
        self.election_deadline = 0.0
        self.reset_election_deadline(time.monotonic())
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

    @property
    def last_leader_contact(self) -> float | None:
        return self._last_contact

    @last_leader_contact.setter
    def last_leader_contact(self, at: float | None) -> None:
        self._last_contact = at
        self.contact_mark = self.lag.stalled

    def contact_age(self, now: float) -> float:
        """Seconds since a leader was heard (or since start), less this node's own stalls."""
        return judged_age(now - (self.started_at if self._last_contact is None else self._last_contact),
                          self.lag.since(self.contact_mark))

    def election_due(self, now: float) -> bool:
        """The election timeout has run, counting only the time this node's loop ran."""
        return now >= self.election_deadline + self.lag.since(self.deadline_mark)

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
        self.deadline_mark = self.lag.stalled

    # -- the one transition ----------------------------------------------------------
    def _transition(self, role: Role, leader: str | None, term: int | None = None, vote: object = _KEEP,
                    reason: str = "") -> None:
        """Change role, leader, and (persisted first) term and vote; history records each change.
        A new term clears the vote unless `vote` names one."""
        old_role, old_term, old_leader = self.role, self.term, self.leader_id
        new_term = old_term if term is None else term
        if new_term > MAX_TERM:
            raise ValueError(f"term {new_term} is above the bound {MAX_TERM}")
        if new_term != old_term or vote is not _KEEP:
            voted = (None if new_term != old_term else self.store.voted_for) if vote is _KEEP else vote
            self.store.save(new_term, voted)  # type: ignore[arg-type]
            bind_term(new_term)
        self.role, self.leader_id = role, leader
        if role is not Role.LEADER:
            self.ack_times = {}
        if new_term != old_term and role is Role.FOLLOWER:
            self.history.append("term_adopted", new_term, leader=leader, was_leader=old_role is Role.LEADER)
        if old_role is Role.LEADER and role is not Role.LEADER:
            self.history.append("stepped_down", new_term, reason=reason)
            log.warning("stepped down", reason=reason, term=new_term)
        if role is Role.CANDIDATE and (old_role is not Role.CANDIDATE or new_term != old_term):
            self.history.append("became_candidate", new_term)
        if role is Role.LEADER and old_role is not Role.LEADER:
            self.history.append("became_leader", new_term)
            log.info("became leader", term=new_term)
        elif role is Role.FOLLOWER and leader is not None and leader != old_leader and new_term == old_term:
            self.history.append("leader_observed", new_term, leader=leader)

    def term_check(self, term: int, sender: str) -> str | None:
        """Why `term`, sent by voter `sender`, must not be adopted (None: it may): the bounded
        step above every other voter's gossiped term (election.term_refusal). A refusal is
        counted, kept for /status and reported."""
        if term <= self.term:
            return None
        others = [st.term for v in self.voters if v not in (self.node_id, sender)
                  and (st := self.membership.state_of(v)) is not None]
        why = rules.term_refusal(term, self.term, others, self.max_term_step)
        if why is not None:
            self.terms_refused += 1
            self.last_term_refusal = {"from": sender, "term": term, "reason": why, "at": time.time()}
            if self.on_term_refused is not None:
                self.on_term_refused(sender, term, why)
        return why

    def observe_term(self, term: int, sender: str, leader: str | None = None) -> bool:
        """A newer term from configured voter `sender`: persist it and follow, unless it is too
        far ahead (term_check); True when adopted (callers checked who sent it)."""
        if term <= self.term or self.term_check(term, sender) is not None:
            return False
        self._transition(Role.FOLLOWER, leader, term=term, reason="higher term")
        return True

    def observe_answer(self, peer: str, term: int) -> None:
        """A term in an answer: adopted only when that peer is a configured voter."""
        if peer in self.voters and peer != self.node_id:
            self.observe_term(term, peer)

    def step_down(self, reason: str) -> None:
        self._transition(Role.FOLLOWER, None, reason=reason)
        self.reset_election_deadline(time.monotonic())

    def check_step_down(self, now: float) -> None:
        """Check-quorum as raft does it, judged less our own stalls since the last ack
        (loop_lag.check_quorum_deadline): a leader past its lease stops mutating at once
        (`can_mutate` reads the lease unstretched) and keeps sending heartbeats; it steps down,
        and says why, only after an election timeout without a quorum's acks."""
        until = self.lease_until(now)
        if until is not None:  # acks we could not read while stalled are not the voters' silence
            until = check_quorum_deadline(until, self.timing.leader_lease, self.timing.election_timeout_min,
                                          self.lag.since(self.ack_mark))
        if rules.decide_step_down(self.role, until, now, False):
            stalled = self.lag.last
            self.step_down("lease expired without quorum acks (check-quorum)"
                           + (f"; this node's loop was stalled {stalled:.2f} s" if stalled >= 0.1 else ""))

    # -- certificates ----------------------------------------------------------------
    def refuse(self, peer: str, code: str, why: str) -> None:
        if self.on_refused is not None:
            self.on_refused(peer, code, why)

    def note_certified(self, term: int, leader: str) -> None:
        self.certified[term] = leader
        while len(self.certified) > CERTIFIED_TERMS:
            del self.certified[min(self.certified)]

    def election_refusal(self, term: int, leader_id: str, election: QuorumCert | None) -> str | None:
        """Why `leader_id` is not proven leader of `term` (None: it is, now or before)."""
        if leader_id == self.node_id or self.certified.get(term) == leader_id:
            return None
        return certificate_refusal(election, self.voters, self.verify_sig, kind="vote", term=term, subject=leader_id)

    # -- the gate of leader messages -------------------------------------------------
    def admit(self, term: int, sender: str, leader_id: str, election: QuorumCert | None = None) -> str | None:
        """None when a message of `leader_id`'s in `term`, sent by `sender`, may be handled
        (its term adopted and its leader followed); else why not. Order: module docstring."""
        if rules.term_relation(term, self.term) == "stale":
            return f"stale term {term} < {self.term}"
        if sender != leader_id:
            return f"sent by {sender} on behalf of {leader_id}"
        if leader_id not in self.voters:
            return f"{leader_id} is not a configured voter"
        if (why := self.term_check(term, sender)) is not None:  # the cheap bound before any signature
            return why
        if (why := self.election_refusal(term, leader_id, election)) is not None:
            self.refuse(sender, "no_election_certificate", f"term {term}: {why}")
            return f"election certificate: {why}"
        self.note_certified(term, leader_id)
        if term == self.term:
            if self.role is Role.LEADER and leader_id != self.node_id:
                log.error("a message from another leader in my term", other=leader_id, term=term)
                return f"{self.node_id} leads term {term}"
            if self.leader_id not in (None, leader_id):
                return f"{self.leader_id} leads term {term}, not {leader_id}"
        if leader_id != self.node_id and (term > self.term or self.leader_id != leader_id
                                          or self.role is not Role.FOLLOWER):
            self._transition(Role.FOLLOWER, leader_id, term=term, reason="another leader's message")
        return None

    # -- talking to voters -----------------------------------------------------------
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
        """One request to every other voter with a known address (None answers: unreachable, or
        answered by another node than that voter)."""
        calls = {}
        for voter in self.voters:
            addr = self.addr_of(voter) if voter != self.node_id else None
            if addr:
                calls[voter] = self.client.post(addr, path, req, response, self.timing.request_timeout, expect=voter)
        return calls

    def spawn(self, coro: Awaitable[object]) -> None:
        """Run `coro` in the background; cancelled with the node (cancel_tasks)."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def cancel_tasks(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def run_election(self, transfer_from: str | None = None) -> bool:  # consensus.py
        raise NotImplementedError
