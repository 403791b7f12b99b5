"""Pure rules of the work queue: what fits a worker, when a fencing token is stale, what
happens to an item whose claim lapsed, and when a new leader adopts a claim it learned of."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

TRAINING_KIND = "training"  # /work/claim_training hands out only items of this kind
TRAINING_JOIN_KIND = "training_join"  # a further node rank of a spanned training run
TRAINING_KINDS = (TRAINING_KIND, TRAINING_JOIN_KIND)  # what /work/claim_training hands out
# An item that waits `prefer_s` seconds from its creation for one of `prefer_nodes`, then takes
# anyone who fits: the next generation's training for the node whose trainer stays (scheduling.py)
PREFER_KEYS = ("prefer_nodes", "prefer_s")


@dataclass(frozen=True)
class WorkSpec:
    """One unit of work the leader wants done; (kind, key) identifies it across leaders."""

    kind: str
    key: str
    payload: dict[str, Any] = field(default_factory=dict)
    requirements: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    ttl: float | None = None
    # The item's result lives only in its finisher's gossip (a gauntlet shard's tally): when the
    # finisher is gone while the spec is still wanted, the result went with it and the item is
    # queued again (WorkQueue.reconcile); else its finished row kept it from ever being re-asked.
    reopen_when_finisher_gone: bool = False

    @property
    def item_id(self) -> str:
        return item_id(self.kind, self.key)


def item_id(kind: str, key: str) -> str:
    return f"{kind}:{key}"


def fits(requirements: Mapping[str, Any], capabilities: Mapping[str, Any], node_id: str | None = None,
         age_s: float = math.inf) -> bool:
    """needs_gpu, min_memory_gb, min_cpus against what the worker says it has; exclude_nodes
    against who it is (a join item must not go to the node that hosts the rendezvous);
    prefer_nodes against who it is while the item, `age_s` old, is younger than prefer_s."""
    if node_id is not None and node_id in (requirements.get("exclude_nodes") or ()):
        return False
    preferred = requirements.get("prefer_nodes") or ()
    try:
        waits = age_s < float(requirements.get("prefer_s", 0) or 0)
    except (TypeError, ValueError):
        waits = False
    if preferred and waits and node_id not in preferred:
        return False
    if requirements.get("needs_gpu") and not capabilities.get("gpus", 0):
        return False
    try:
        if float(capabilities.get("memory_gb", 0) or 0) < float(requirements.get("min_memory_gb", 0) or 0):
            return False
        if int(capabilities.get("cpus", 0) or 0) < int(requirements.get("min_cpus", 0) or 0):
            return False
    except (TypeError, ValueError):  # capabilities are typed on the wire; this guards local callers
        return False
    return True


def token_refusal(
    *,
    can_mutate: bool,
    current_term: int,
    token_term: int,
    token_seq: int,
    item_state: str | None,
    item_term: int | None,
    item_seq: int | None,
    claimed_by: str | None,
    node_id: str,
    expires_at: float | None,
    now: float,
) -> str | None:
    """None when the token may renew/complete/fail its claim, else why not (-> HTTP 409)."""
    if not can_mutate:
        return "not the leader (or no quorum)"
    if token_term < current_term:
        return f"stale term {token_term} < {current_term}"
    if token_term > current_term:
        return f"unknown future term {token_term}"
    if item_state is None:
        return "unknown work item"
    if item_state != "claimed" or item_term != token_term or item_seq != token_seq:
        return "stale token: the claim is no longer held"
    if claimed_by != node_id:
        return "claim held by another node"
    if expires_at is None or now >= expires_at:
        return "claim expired"
    return None


def state_after_lapse(attempts: int, max_attempts: int) -> str:
    """A claim that expired or failed: back to the queue until attempts run out."""
    return "failed" if attempts >= max_attempts else "pending"


def adopted_token_matches(
    *, current_term: int, token_term: int, token_seq: int, item_state: str | None, item_term: int | None,
    claimed_by: str | None, node_id: str, adopted_term: int | None, adopted_seq: int | None,
) -> bool:
    """A token of an earlier leader that this leader adopted (it learned the claim from gossip):
    its holder's renew / complete / fail is accepted and handed the new-term token."""
    return (token_term < current_term and item_state == "claimed" and item_term == current_term
            and claimed_by == node_id and (adopted_term, adopted_seq) == (token_term, token_seq))


def may_adopt(
    *, current_term: int, token_term: int, token_seq: int, item_state: str | None,
    adopted_term: int | None, adopted_seq: int | None, holder_alive: bool,
) -> bool:
    """A new leader takes over a live claim an earlier leader gave (no wasted round), unless the
    item is no longer free here (given to another node, or done) or this very token was adopted
    before (it lapsed since: the holder did not renew in time)."""
    return (holder_alive and token_term < current_term and item_state == "pending"
            and (adopted_term, adopted_seq) != (token_term, token_seq))


def completion_refusal(
    *, current_term: int, token: tuple[int, int], claimant: str, item_state: str | None,
    claimed_by: str | None, claim: tuple[int | None, int | None], adopted: tuple[int | None, int | None],
    newest_known: tuple[int, int] | None, grant_proven: bool,
) -> str | None:
    """Whether the leader admits a claimant's completion carried by gossip (its signature already
    checked, completions.py): None when `token` was the live claim on the item, else why not.

    A token of this term must be the claim held now. A token of an earlier term must carry that
    term's proven leader's grant, and be the live claim: the one this leader adopted from the
    claimant, or, with the item not claimed here, no later claim on it known from gossip. So a
    completion survives a leader change, and nothing but a real claimant's completion marks
    work done."""
    if item_state == "failed":
        return "the item failed: its attempts ran out"
    if token[0] > current_term:
        return f"token of a future term {token[0]}"
    if token[0] == current_term:
        if item_state == "claimed" and claim == token and claimed_by == claimant:
            return None
        return "stale token: not the claim held now"
    if not grant_proven:
        return f"no proof that the leader of term {token[0]} granted this claim"
    if item_state == "claimed":
        if claimed_by == claimant and adopted == token:
            return None
        return f"stale token: the item is claimed under term {claim[0]}"
    if newest_known is not None and newest_known > token:
        return f"stale token: a later claim {list(newest_known)} on the item is known"
    return None
