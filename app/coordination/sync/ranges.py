"""The id space of a replicated store, cut into ranges, and who should hold what: pure functions.

Ids are strings; a range is named by a hex prefix p and covers [lo(p), hi(p)) in string order.
The children of p are p+"0" .. p+"f", and the first and last child stretch to their parent's
bounds, so the ranges at every depth partition ALL strings (an id that is not hex still lands
in exactly one range at each depth, and in the child of the range it lands in above). For hex
ids (uuid4().hex, sha256 hex) the range of an id at depth d is simply id[:d], and ranges hold
about equally many ids. Two nodes compare a range by its digest (count, XOR of the ids' hashes):
equal digests mean equal sets, so only ranges that differ are split or listed.

Placement: each (origin, fine range) is held by its origin (while it is alive) and by the next
nodes in rendezvous-hash order over the alive members, so a node that leaves moves only its
own share, and every node computes the same answer from the same membership.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

HEX = "0123456789abcdef"
FINE_DEPTH = 2  # 256 fine ranges per origin: the granularity of the in-memory index and of placement
MAX_DEPTH = 6  # below this a differing range is listed, however many ids it holds

Digest = tuple[int, int]  # (count, XOR of id_hash over the ids)
EMPTY: Digest = (0, 0)


def id_hash(uid: str) -> int:
    """64 bits of sha256 of the id: XORed into a range's digest."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big")


def combine(a: Digest, b: Digest) -> Digest:
    return a[0] + b[0], a[1] ^ b[1]


def digest_of(uids: Iterable[str]) -> Digest:
    count, x = 0, 0
    for uid in uids:
        count += 1
        x ^= id_hash(uid)
    return count, x


def is_prefix(prefix: str) -> bool:
    return len(prefix) <= MAX_DEPTH and all(c in HEX for c in prefix)


def bounds(prefix: str) -> tuple[str, str | None]:
    """[lo, hi) of the range `prefix`; hi None means no upper bound."""
    if prefix == "":
        return "", None
    lo = prefix.rstrip("0")  # a first child starts where its parent starts
    head, last = prefix[:-1], prefix[-1]
    hi = bounds(head)[1] if last == "f" else head + HEX[HEX.index(last) + 1]
    return lo, hi


def range_of(uid: str, depth: int) -> str:
    """The prefix of the depth-`depth` range that holds `uid`."""
    head = uid[:depth]
    if len(head) == depth and all(c in HEX for c in head):
        return head  # the common case: a hex id
    prefix = ""
    for _ in range(depth):
        child = 0
        for i in range(15, 0, -1):
            if prefix + HEX[i] <= uid:
                child = i
                break
        prefix += HEX[child]
    return prefix


def children(prefix: str) -> list[str]:
    return [prefix + c for c in HEX]


def fine_under(prefix: str) -> list[str]:
    """The fine ranges inside `prefix` (len(prefix) <= FINE_DEPTH)."""
    out = [prefix]
    for _ in range(FINE_DEPTH - len(prefix)):
        out = [p + c for p in out for c in HEX]
    return out


def fine_of(prefix: str) -> str:
    """The fine range a deeper prefix lies in (or the prefix itself at FINE_DEPTH)."""
    return prefix[:FINE_DEPTH]


# -- placement ---------------------------------------------------------------------------------
def effective_factor(configured: int, clustered: bool) -> int:
    """A lone node keeps one copy; a cluster aims at the configured factor."""
    return max(1, configured) if clustered else 1


def holders(origin: str, fine: str, members: Sequence[str], factor: int) -> list[str]:
    """Who should hold origin's games in fine range `fine`: the origin while it is a member,
    then the members highest in rendezvous order, `factor` nodes in all (fewer when fewer exist)."""
    others = sorted((m for m in members if m != origin),
                    key=lambda m: hashlib.sha256(f"{origin}\0{fine}\0{m}".encode()).digest(), reverse=True)
    if origin in members:
        return [origin, *others[: max(0, factor - 1)]]
    return others[:factor]


def responsible(me: str, origin: str, prefix: str, members: Sequence[str], factor: int) -> bool:
    """Whether `me` should hold some of origin's games in range `prefix`."""
    fines = fine_under(prefix) if len(prefix) <= FINE_DEPTH else [fine_of(prefix)]
    return any(me in holders(origin, f, members, factor) for f in fines)


def under_replicated(lacking: dict[str, set[str] | None], factor: int) -> set[str] | None:
    """Which of this node's own games fewer than `factor` nodes hold (this node counts as one);
    None means all of them.

    `lacking[peer]` is the set of own games that peer does not hold, or None when it is not
    known to hold any (unreachable, or none at all): a peer holds every own game not in its set.
    """
    if factor <= 1:
        return set()
    known = [s for s in lacking.values() if s is not None]
    if len(known) < factor - 1:
        return None
    allowed_missing = len(known) - (factor - 1)  # a game may be absent from this many peers
    counts: dict[str, int] = {}
    for s in known:
        for uid in s:
            counts[uid] = counts.get(uid, 0) + 1
    return {uid for uid, n in counts.items() if n > allowed_missing}
