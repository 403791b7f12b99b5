"""Consensus's decisions: one value per key through a quorum of voters (the rules and why are
in decision.py: single-decree Paxos with terms as ballots). The leader side reads a quorum
(phase 1), has a quorum store the chosen value (phase 2), and tells the voters it is decided
(the learn step); the voter side answers those three messages. Reads and stores pass `admit`
(a leader proven by its election certificate); a voter that stores signs its ack of (term, key,
sha256(value)), and the leader's decision certificate, a majority of those acks, is what makes a
value decided anywhere: `/commit/decided` and gossip (`learn_decided`) carry it, and a node
takes a decided value only with one that checks (quorum_cert.py)."""

from __future__ import annotations

from typing import Any

from app.coordination.p2p import election as rules
from app.coordination.p2p.consensus_core import ConsensusCore
from app.coordination.p2p.decision import Stored, choose_value
from app.coordination.p2p.quorum_cert import ack_text, certificate_refusal, make_cert, signature_of, value_digest
from app.coordination.p2p.schemas import (
    CommitReadRequest,
    CommitReadResponse,
    CommitRequest,
    CommitResponse,
    QuorumCert,
    VoterSignature,
)


class Deciding(ConsensusCore):
    # -- leader ----------------------------------------------------------------------
    async def decide(self, key: str, proposal: str | None) -> str | None:
        """Leader only: the value decided for `key` (ours, or one decided or half-stored before),
        or None when there is no quorum, a newer term appeared, or nothing was ever proposed."""
        if not self.can_mutate():
            return None
        if (known := self.commits.decided_value(key)) is not None and key in self.commits.certs:
            return known  # decided for good, and we hold the proof
        term = self.term
        read: dict[str, Stored | None] = {}
        if self.is_voter:
            read[self.node_id] = self.commits.get_stored(key)
        req = CommitReadRequest(term=term, leader_id=self.node_id, key=key, election=self.election_cert)
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
        cert = await self._store_on_quorum(key, value, term)
        if cert is None or not self.commits.learn(key, value, cert):
            return None
        self._announce_decided(key, value, term, cert)
        return value

    def _acked(self, voter: str, text: bytes, r: CommitResponse, cache: dict[str, bool]) -> bool:
        """A store counts only with the voter's valid signed ack."""
        if voter not in cache:
            cache[voter] = r.stored and self.verify_sig(voter, text, r.sig, r.cert)
            if r.stored and not cache[voter]:
                self.refuse(voter, "ack_unsigned", "a stored ack without a valid signature")
        return cache[voter]

    async def _store_on_quorum(self, key: str, value: str, term: int) -> QuorumCert | None:
        """Phase 2: store `value` under `key` on a quorum of voters in `term` (this node included
        when it is a voter); the decision certificate (their signed acks) only when a quorum
        stored it and we still lead that term."""
        if not self.can_mutate() or self.term != term:
            return None
        digest = value_digest(value)
        text = ack_text(term, key, digest)
        acks: dict[str, VoterSignature] = {}
        if self.is_voter:
            if not self.commits.store(key, value, term)[0]:
                return None
            acks[self.node_id] = signature_of(self.identity, text, self.node_id)
        req = CommitRequest(term=term, leader_id=self.node_id, key=key, value=value, election=self.election_cert)
        checked: dict[str, bool] = {}

        def enough(answers: dict[str, CommitResponse]) -> bool:
            return rules.votes_won(self.voters, set(acks) | {v for v, r in answers.items()
                                                             if self._acked(v, text, r, checked)})

        answers = await self.gather_until(self.post_to_voters("/commit", req, CommitResponse), enough)
        for voter, r in answers.items():
            self.observe_answer(voter, r.term)
            if self._acked(voter, text, r, checked):
                acks[voter] = VoterSignature(voter=voter, sig=r.sig, cert=r.cert)
        if self.term != term or not rules.votes_won(self.voters, set(acks)):
            return None
        return make_cert("ack", term, key, acks.values(), digest=digest)

    def _announce_decided(self, key: str, value: str, term: int, cert: QuorumCert) -> None:
        """Paxos's learn step, with its proof: voters take the value as decided on the decision
        certificate (at once, rather than when gossip brings it); a lost message only delays
        them until that gossip."""
        req = CommitRequest(term=term, leader_id=self.node_id, key=key, value=value, election=self.election_cert,
                            decided=cert)
        for call in self.post_to_voters("/commit/decided", req, CommitResponse).values():
            self.spawn(call)

    def decision_refusal(self, key: str, value: str, cert: QuorumCert | None) -> str | None:
        """Why `cert` does not prove `value` decided for `key` (None: it does)."""
        return certificate_refusal(cert, self.voters, self.verify_sig, kind="ack", term=None, subject=key,
                                   digest=value_digest(value))

    def learn_decided(self, peer: str, key: str, value: str, cert: QuorumCert | None) -> str | None:
        """Take `value` as decided for `key` on its certificate (None), else why not (counted)."""
        if self.commits.decided_value(key) == value and key in self.commits.certs:
            return None
        why = self.decision_refusal(key, value, cert)
        why = None if why is None else f"decision certificate: {why}"
        if why is None and not self.commits.learn(key, value, cert):  # type: ignore[arg-type]
            why = "another value is decided here for this key"
        if why is not None:
            self.refuse(peer, "decided_without_certificate", f"{key}: {why}")
        return why

    # -- voter -----------------------------------------------------------------------
    def handle_read(self, sender: str, req: CommitReadRequest) -> CommitReadResponse:
        """Phase 1: adopting the reader's term promises to refuse older leaders from now on."""
        if self.admit(req.term, sender, req.leader_id, req.election) is not None:
            return CommitReadResponse(term=self.term, ok=False)
        stored = self.commits.get_stored(req.key)
        return CommitReadResponse(term=self.term, ok=True, value=stored.value if stored else None,
                                  value_term=stored.term if stored else None)

    def handle_store(self, sender: str, req: CommitRequest) -> CommitResponse:
        """Phase 2: store unless a value of this same term differs (decision.may_store); the
        answer carries our signed ack, which the leader's decision certificate is made of."""
        refusal = self.admit(req.term, sender, req.leader_id, req.election)
        if refusal is not None:
            return CommitResponse(term=self.term, stored=False, reason=refusal)
        stored, why = self.commits.store(req.key, req.value, req.term)
        if not stored:
            return CommitResponse(term=self.term, stored=False, reason=why)
        ack = signature_of(self.identity, ack_text(req.term, req.key, value_digest(req.value)), self.node_id)
        return CommitResponse(term=self.term, stored=True, sig=ack.sig, cert=ack.cert)

    def handle_decided(self, sender: str, req: CommitRequest) -> CommitResponse:
        """The learn step: (key, value) is decided once its decision certificate checks, whoever
        brings it and whatever our term; without one nothing changes."""
        why = self.learn_decided(sender, req.key, req.value, req.decided)
        return CommitResponse(term=self.term, stored=why is None, reason=why or "")

    # -- gossip ----------------------------------------------------------------------
    def decided_for_gossip(self, prefixes: tuple[str, ...], limit: int) -> list[dict[str, Any]]:
        """The newest decided values under `prefixes` with their decision certificates (signers'
        certificates left out: every node learns the voters' own from their gossiped states)."""
        return [{"key": k, "value": v, "cert": c.model_dump()} for k, v, c in self.commits.certified(prefixes, limit)]

    def learn_entries(self, peer: str, entries: Any) -> list[str]:
        """Take the decided values `peer` passed on (`decided_for_gossip`'s form) whose
        certificates check; the keys learned. Anything else is refused and counted
        (`decided_without_certificate`): no value is decided on one member's word."""
        learned: list[str] = []
        if not isinstance(entries, list):
            return learned
        for entry in entries[:1024]:
            try:
                key, value = str(entry["key"]), str(entry["value"])
                if self.commits.decided_value(key) == value and key in self.commits.certs:
                    continue
                cert = QuorumCert.model_validate(entry.get("cert"))
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                self.refuse(peer, "decided_without_certificate", f"malformed entry: {str(exc)[:200]}")
                continue
            if self.learn_decided(peer, key, value, cert) is None:
                learned.append(key)
        return learned
