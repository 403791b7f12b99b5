"""The leader's work queue over SQLite: claims with TTLs and (term, seq) fencing tokens.

Level-triggered: `rebuild` at the start of a term and `reconcile` every few seconds derive
the queue from what must be done (the work source over the cluster view) plus what gossip
says is in flight or finished, so a leader change loses no work. Claims made under an older
term are void under a new one, except those the new leader learns of from gossip while their
holder is alive: it adopts them (no wasted round), and the holder's next renew is answered with
a token of the new term. An item the new leader already gave to another node stays refused (409).

Every `now` here is the leader's monotonic clock (claim expiry must not move with wall-clock jumps).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.coordination.p2p.schemas import ClaimInfo, Completion, Token, WorkItemOut
from app.coordination.p2p.work_rules import (
    WorkSpec,
    adopted_token_matches,
    completion_refusal,
    fits,
    may_adopt,
    state_after_lapse,
    token_refusal,
)
from app.db.work_queue import CLAIMED, DONE, FAILED, PENDING, WorkItemRow, make_engine

CLAIM_PAGE = 16  # candidates read per query by `claim`
IN_CHUNK = 500  # item ids per IN (...) in one statement


@dataclass(frozen=True)
class ClaimGrant:
    item: WorkItemOut
    token: Token
    ttl: float


class WorkQueue:
    def __init__(self, path: Path, max_attempts: int, default_ttl: float) -> None:
        self.engine = make_engine(path)
        self.max_attempts = max_attempts
        self.default_ttl = default_ttl
        # Last seq handed out per term. Released claims clear their row's seq, so the rows
        # alone cannot tell; a term has one leader process, so memory is enough.
        self._last_seq: dict[int, int] = {}

    def close(self) -> None:
        self.engine.dispose()

    # -- leader change / reconcile --------------------------------------------------
    def rebuild(
        self,
        term: int,
        specs: Iterable[WorkSpec] | None,
        in_flight: Iterable[ClaimInfo],
        now: float,
        live: Iterable[tuple[str, ClaimInfo]] = (),
    ) -> None:
        """Start of a term: void older claims, fold in the attempts gossip knows, reconcile, then
        adopt the `live` claims ((holder, claim) of holders that are alive, their grants proven).
        Work done under earlier leaders comes back only as the claimants' signed completions
        (`admit`, completions.py): nothing else marks an item done."""
        in_flight = list(in_flight)
        with Session(self.engine) as s, s.begin():
            for row in s.scalars(select(WorkItemRow).where(WorkItemRow.state == CLAIMED)):
                if (row.claim_term or 0) < term:
                    self._release(row)
            attempts = {c.item_id: c.attempts for c in in_flight}
            for row in s.scalars(select(WorkItemRow).where(WorkItemRow.item_id.in_(attempts))):
                row.attempts = max(row.attempts, attempts[row.item_id])
        self.reconcile(specs, now, in_flight_attempts=attempts)
        self.adopt(term, live, now)

    def adopt(self, term: int, live: Iterable[tuple[str, ClaimInfo]], now: float) -> list[str]:
        """Take over claims of earlier leaders whose holders are alive (work_rules.may_adopt);
        the item ids adopted."""
        adopted = []
        with Session(self.engine) as s, s.begin():
            for holder, info in live:
                row = s.get(WorkItemRow, info.item_id)
                if row is None or not may_adopt(
                    current_term=term, token_term=info.token.term, token_seq=info.token.seq, item_state=row.state,
                    adopted_term=row.adopted_term, adopted_seq=row.adopted_seq, holder_alive=True,
                ) or holder in ((row.requirements or {}).get("exclude_nodes") or ()):
                    continue
                row.state, row.attempts = CLAIMED, max(row.attempts, info.attempts, 1)
                row.claim_term, row.claim_seq, row.claimed_by = term, self._next_seq(s, term), holder
                row.adopted_term, row.adopted_seq = info.token.term, info.token.seq
                row.expires_at = now + (row.ttl or self.default_ttl)
                adopted.append(row.item_id)
        return adopted

    def reconcile(
        self,
        specs: Iterable[WorkSpec] | None,
        now: float,
        in_flight_attempts: dict[str, int] | None = None,
        alive: set[str] | None = None,
    ) -> list[str]:
        """Expire lapsed claims; add wanted items; drop pending ones no longer wanted; queue again
        a finished item still wanted whose spec says its result died with its finisher, when the
        finisher is not in `alive` (the caller's nodes not known dead). The ids queued again."""
        in_flight_attempts = in_flight_attempts or {}
        reopened: list[str] = []
        with Session(self.engine) as s, s.begin():
            for row in s.scalars(
                select(WorkItemRow).where(WorkItemRow.state == CLAIMED, WorkItemRow.expires_at <= now)
            ):
                self._release(row)
            if specs is None:
                return reopened
            wanted = {spec.item_id: spec for spec in specs}
            # Only the rows this can change: the wanted ones and the pending ones. Finished rows
            # stay in the table for good (they keep a finished item from being queued again) and
            # would otherwise be loaded on every reconcile, a cost growing with the cluster's age.
            existing = _pending_or_named(s, list(wanted))
            for iid, spec in wanted.items():
                row = existing.get(iid)
                if row is None:
                    s.add(
                        WorkItemRow(
                            item_id=iid, kind=spec.kind, key=spec.key, payload=dict(spec.payload),
                            requirements=dict(spec.requirements), priority=spec.priority,
                            ttl=spec.ttl, state=PENDING,
                            attempts=in_flight_attempts.get(iid, 0), created_at=now,
                        )
                    )
                elif row.state == PENDING:
                    row.payload, row.requirements = dict(spec.payload), dict(spec.requirements)
                    row.priority, row.ttl = spec.priority, spec.ttl
                elif (row.state == DONE and spec.reopen_when_finisher_gone and alive is not None
                      and (row.completion or {}).get("node_id") not in alive):
                    row.state, row.finished_at, row.completion = PENDING, None, None
                    reopened.append(iid)
            for iid, row in existing.items():
                if row.state == PENDING and iid not in wanted:
                    s.delete(row)
        return reopened

    def admit(self, c: Completion, term: int, now: float, newest_known: tuple[int, int] | None,
              grant_proven: bool) -> str | None:
        """A claimant's completion carried by gossip, its signature checked by the caller: mark
        its item done if its token was the live claim (work_rules.completion_refusal); None when
        admitted (or the item was already done), else why not."""
        with Session(self.engine) as s, s.begin():
            row = s.get(WorkItemRow, c.item_id)
            if row is None:
                return "not queued here"
            if row.state == DONE:
                return None
            why = completion_refusal(
                current_term=term, token=(c.token.term, c.token.seq), claimant=c.node_id, item_state=row.state,
                claimed_by=row.claimed_by, claim=(row.claim_term, row.claim_seq),
                adopted=(row.adopted_term, row.adopted_seq), newest_known=newest_known, grant_proven=grant_proven,
            )
            if why is not None:
                return why
            self._done(row, c, now)
            return None

    def open_items(self, item_ids: set[str]) -> set[str]:
        """Those of `item_ids` pending or claimed here (what a completion can still change)."""
        ids, out = sorted(item_ids), set()
        with Session(self.engine) as s:
            for start in range(0, len(ids), IN_CHUNK):
                out.update(s.scalars(select(WorkItemRow.item_id).where(
                    WorkItemRow.item_id.in_(ids[start:start + IN_CHUNK]), WorkItemRow.state.in_((PENDING, CLAIMED)))))
        return out

    def _done(self, row: WorkItemRow, c: Completion, now: float) -> None:
        row.state, row.finished_at, row.completion = DONE, now, c.model_dump(mode="json")
        row.claim_term = row.claim_seq = row.claimed_by = row.expires_at = None

    def _release(self, row: WorkItemRow) -> None:
        row.state = state_after_lapse(row.attempts, self.max_attempts)
        row.claim_term = row.claim_seq = row.claimed_by = row.expires_at = None  # adopted_* kept: no re-adoption

    # -- worker calls ----------------------------------------------------------------
    def claim(
        self, node_id: str, capabilities: dict[str, Any], kinds: list[str] | None, term: int, now: float
    ) -> ClaimGrant | None:
        with Session(self.engine) as s, s.begin():
            for row in s.scalars(
                select(WorkItemRow).where(WorkItemRow.state == CLAIMED, WorkItemRow.expires_at <= now)
            ):
                self._release(row)  # lapsed claims are claimable now, not at the next reconcile
            s.flush()
            query = select(WorkItemRow).where(WorkItemRow.state == PENDING)
            if kinds is not None:
                query = query.where(WorkItemRow.kind.in_(kinds))
            query = query.order_by(WorkItemRow.priority.desc(), WorkItemRow.created_at, WorkItemRow.item_id)
            # Page through the candidates in claim order: nearly always the first fits, and
            # loading every pending row (each with two JSON columns) was most of a claim's CPU.
            offset = 0
            while True:
                page = s.scalars(query.limit(CLAIM_PAGE).offset(offset)).all()
                for row in page:
                    if not fits(row.requirements or {}, capabilities, node_id, now - (row.created_at or 0.0)):
                        continue
                    seq = self._next_seq(s, term)
                    ttl = row.ttl or self.default_ttl
                    row.state, row.attempts = CLAIMED, row.attempts + 1
                    row.claim_term, row.claim_seq, row.claimed_by = term, seq, node_id
                    row.expires_at = now + ttl
                    return ClaimGrant(_out(row), Token(term=term, seq=seq), ttl)
                if len(page) < CLAIM_PAGE:
                    return None
                offset += CLAIM_PAGE

    def _next_seq(self, s: Session, term: int) -> int:
        """One past the term's last seq. The rows are read once per term (a restarted leader,
        or one that adopted claims): released claims clear their seq, so after that the memory
        of this process, the term's only writer, is the record."""
        last = self._last_seq.get(term)
        if last is None:
            last = s.scalar(select(func.max(WorkItemRow.claim_seq)).where(WorkItemRow.claim_term == term)) or 0
        self._last_seq = {term: last + 1}
        return last + 1

    def renew(self, node_id: str, iid: str, token: Token, term: int, can_mutate: bool, now: float) -> tuple[str | None, float | None]:
        reason, ttl, _ = self.renew_token(node_id, iid, token, term, can_mutate, now)
        return reason, ttl

    def renew_token(self, node_id: str, iid: str, token: Token, term: int, can_mutate: bool, now: float
                    ) -> tuple[str | None, float | None, Token | None]:
        """(refusal, ttl, the token to use from now on: a new-term one for an adopted claim)."""
        with Session(self.engine) as s, s.begin():
            row = s.get(WorkItemRow, iid)
            refusal = self._refusal(row, node_id, token, term, can_mutate, now)
            if refusal is not None:
                return refusal, None, None
            assert row is not None
            ttl = row.ttl or self.default_ttl
            row.expires_at = now + ttl
            return None, ttl, Token(term=row.claim_term or term, seq=row.claim_seq or 0)

    def finish(
        self, node_id: str, iid: str, token: Token, term: int, can_mutate: bool, now: float,
        ok: bool, error: str = "", completion: Completion | None = None, completion_problem: str | None = None,
    ) -> str | None:
        """Complete (ok=True) or fail a claim; None on success, else the reason. A completion
        is admitted only with the claimant's signed `completion` (kept on the row, gossiped
        by the leader): `completion_problem` is why the caller found it wanting, returned once
        the token itself checks."""
        with Session(self.engine) as s, s.begin():
            row = s.get(WorkItemRow, iid)
            refusal = self._refusal(row, node_id, token, term, can_mutate, now)
            if refusal is not None:
                return refusal
            assert row is not None
            if ok:
                if completion_problem is not None or completion is None:
                    return completion_problem or "no signed completion"
                self._done(row, completion, now)
            else:
                row.last_error = error[:4096]
                self._release(row)
            return None

    def _refusal(
        self, row: WorkItemRow | None, node_id: str, token: Token, term: int, can_mutate: bool, now: float
    ) -> str | None:
        if can_mutate and row is not None and adopted_token_matches(
            current_term=term, token_term=token.term, token_seq=token.seq, item_state=row.state,
            item_term=row.claim_term, claimed_by=row.claimed_by, node_id=node_id,
            adopted_term=row.adopted_term, adopted_seq=row.adopted_seq,
        ):
            token = Token(term=term, seq=row.claim_seq or 0)  # the adopted claim, under its new token
        return token_refusal(
            can_mutate=can_mutate, current_term=term, token_term=token.term, token_seq=token.seq,
            item_state=row.state if row else None, item_term=row.claim_term if row else None,
            item_seq=row.claim_seq if row else None, claimed_by=row.claimed_by if row else None,
            node_id=node_id, expires_at=row.expires_at if row else None, now=now,
        )

    # -- reading ---------------------------------------------------------------------
    def summary(self) -> dict[str, int]:
        with Session(self.engine) as s:
            rows = s.execute(select(WorkItemRow.state, func.count()).group_by(WorkItemRow.state)).all()
        counts = {PENDING: 0, CLAIMED: 0, DONE: 0, FAILED: 0}
        counts.update({state: n for state, n in rows})
        return counts

    def recently_completed(self, limit: int = 200) -> list[str]:
        with Session(self.engine) as s:
            return list(
                s.scalars(
                    select(WorkItemRow.item_id).where(WorkItemRow.state == DONE)
                    .order_by(WorkItemRow.finished_at.desc()).limit(limit)
                )
            )

    def recent_completions(self, limit: int = 64) -> list[Completion]:
        """The signed completions this queue admitted, newest first: what a leader gossips, so
        the next leader can admit them too."""
        with Session(self.engine) as s:
            records = s.scalars(select(WorkItemRow.completion).where(
                WorkItemRow.state == DONE, WorkItemRow.completion.is_not(None))
                .order_by(WorkItemRow.finished_at.desc()).limit(limit)).all()
        return [Completion.model_validate(r) for r in records if r]

    def item(self, iid: str) -> dict[str, Any] | None:
        with Session(self.engine) as s:
            row = s.get(WorkItemRow, iid)
            if row is None:
                return None
            return {
                "item_id": row.item_id, "state": row.state, "attempts": row.attempts,
                "claimed_by": row.claimed_by, "claim_term": row.claim_term, "claim_seq": row.claim_seq,
                "adopted_from": None if row.adopted_term is None else [row.adopted_term, row.adopted_seq],
            }


def _pending_or_named(s: Session, item_ids: list[str]) -> dict[str, WorkItemRow]:
    """The pending rows and the other rows of `item_ids`, by id, each row read once; the ids go
    in chunks that stay far under the databases' bound on parameters in one statement."""
    rows = {row.item_id: row for row in s.scalars(select(WorkItemRow).where(WorkItemRow.state == PENDING))}
    for start in range(0, len(item_ids), IN_CHUNK):
        chunk = item_ids[start:start + IN_CHUNK]
        rows.update((row.item_id, row) for row in s.scalars(
            select(WorkItemRow).where(WorkItemRow.item_id.in_(chunk), WorkItemRow.state != PENDING)))
    return rows


def _out(row: WorkItemRow) -> WorkItemOut:
    return WorkItemOut(
        item_id=row.item_id, kind=row.kind, key=row.key, payload=row.payload or {},
        requirements=row.requirements or {}, attempts=row.attempts,
    )
