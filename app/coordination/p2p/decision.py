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
The rules are the pure functions here; the I/O around them is Consensus's (deciding.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


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
