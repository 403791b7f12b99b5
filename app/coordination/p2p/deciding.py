"""Consensus's decisions: one value per key through a quorum of voters (the rules and why are
in decision.py: single-decree Paxos with terms as ballots). The leader side reads a quorum
(phase 1), has a quorum store the chosen value (phase 2), and tells the voters it is decided
(the learn step); the voter side answers those three messages, each behind `admit`."""

from __future__ import annotations

from app.coordination.p2p import election as rules
from app.coordination.p2p.consensus_core import ConsensusCore
from app.coordination.p2p.decision import Stored, choose_value
from app.coordination.p2p.schemas import (
    CommitReadRequest,
    CommitReadResponse,
    CommitRequest,
    CommitResponse,
)


class Deciding(ConsensusCore):
    # -- leader ----------------------------------------------------------------------
    async def decide(self, key: str, proposal: str | None) -> str | None:
        """Leader only: the value decided for `key` (ours, or one decided or half-stored before),
        or None when there is no quorum, a newer term appeared, or nothing was ever proposed."""
        if not self.can_mutate():
            return None
        term = self.term
        read: dict[str, Stored | None] = {}
        if self.is_voter:
            read[self.node_id] = self.commits.get_stored(key)
        req = CommitReadRequest(term=term, leader_id=self.node_id, key=key)
        calls = self.post_to_voters("/commit/read", req, CommitReadResponse)

        def enough(answers: dict[str, CommitReadResponse]) -> bool:
            return rules.votes_won(self.voters, set(read) | {v for v, r in answers.items() if r.ok})

        answers = await self.gather_until(calls, enough)
        for voter, r in answers.items():
            self.observe_answer(voter, r.term)
        read.update({v: None if r.value is None else Stored(r.value, r.value_term or 0)
                     for v, r in answers.items() if r.ok})
        if self.term != term or not rules.votes_won(self.voters, set(read)):
            return None
        value = choose_value(read.values(), proposal)
        if value is None:
            return None
        if not await self._store_on_quorum(key, value, term):
            return None
        self._announce_decided(key, value, term)
        return value

    async def _store_on_quorum(self, key: str, value: str, term: int) -> bool:
        """Phase 2: store `value` under `key` on a quorum of voters in `term` (this node included
        when it is a voter); True only when a quorum stored it and we still lead that term."""
        if not self.can_mutate() or self.term != term:
            return False
        granted: set[str] = set()
        if self.is_voter:
            if not self.commits.store(key, value, term)[0]:
                return False
            granted.add(self.node_id)
        req = CommitRequest(term=term, leader_id=self.node_id, key=key, value=value)

        def enough(answers: dict[str, CommitResponse]) -> bool:
            return rules.votes_won(self.voters, granted | {v for v, r in answers.items() if r.stored})

        answers = await self.gather_until(self.post_to_voters("/commit", req, CommitResponse), enough)
        for voter, r in answers.items():
            self.observe_answer(voter, r.term)
        stored = granted | {v for v, r in answers.items() if r.stored}
        return self.term == term and rules.votes_won(self.voters, stored)

    def _announce_decided(self, key: str, value: str, term: int) -> None:
        """Paxos's learn step: voters mark the value decided (they act on it at once, rather than
        when gossip brings it); a lost message only delays them until that gossip."""
        if self.is_voter:
            self.commits.mark_decided(key, value)
        req = CommitRequest(term=term, leader_id=self.node_id, key=key, value=value)
        for call in self.post_to_voters("/commit/decided", req, CommitResponse).values():
            self.spawn(call)

    # -- voter -----------------------------------------------------------------------
    def handle_read(self, sender: str, req: CommitReadRequest) -> CommitReadResponse:
        """Phase 1: adopting the reader's term promises to refuse older leaders from now on."""
        if self.admit(req.term, sender, req.leader_id) is not None:
            return CommitReadResponse(term=self.term, ok=False)
        stored = self.commits.get_stored(req.key)
        return CommitReadResponse(term=self.term, ok=True, value=stored.value if stored else None,
                                  value_term=stored.term if stored else None)

    def handle_store(self, sender: str, req: CommitRequest) -> CommitResponse:
        """Phase 2: store unless a value of this same term differs (decision.may_store)."""
        refusal = self.admit(req.term, sender, req.leader_id)
        if refusal is not None:
            return CommitResponse(term=self.term, stored=False, reason=refusal)
        stored, why = self.commits.store(req.key, req.value, req.term)
        return CommitResponse(term=self.term, stored=stored, reason="" if stored else why)

    def handle_decided(self, sender: str, req: CommitRequest) -> CommitResponse:
        """The learn step: a leader's quorum stored (key, value); marked if it is what we hold."""
        refusal = self.admit(req.term, sender, req.leader_id)
        if refusal is not None:
            return CommitResponse(term=self.term, stored=False, reason=refusal)
        marked = self.commits.mark_decided(req.key, req.value)
        return CommitResponse(term=self.term, stored=marked, reason="" if marked else "not the value stored here")
