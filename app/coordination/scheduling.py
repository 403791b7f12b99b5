"""What work the leader asks of the cluster: a pure function of gossiped state.

Inputs are what every node gossips (games created, capabilities, liveness) and the decided
generations; the output is the set of work items that should exist now. The work queue is
level-triggered, so a new leader calling this on the same state asks for the same items and
no work is lost with the old leader.

Self-play needs no item: every node plays continuously with its current best model.
Training is one item per generation, matched by capability: when any live node has a GPU
the item requires one, otherwise any node may claim it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from app.coordination.generation_log import GenerationRecord, latest, latest_promoted
from app.coordination.p2p.work_rules import TRAINING_KIND, WorkSpec


@dataclass(frozen=True)
class NodeSummary:
    """The part of a node's gossip the scheduler reads."""

    node_id: str
    alive: bool
    games_created: int
    gpus: int


def summarize(nodes: Mapping[str, Any], alive_ids: set[str]) -> list[NodeSummary]:
    """NodeSummary per gossiped NodeState (pure: reads the given objects only)."""
    return [
        NodeSummary(
            node_id=nid, alive=nid in alive_ids,
            games_created=int(state.inventory.get("games_created", 0) or 0),
            gpus=int(state.capabilities.get("gpus", 0) or 0),
        )
        for nid, state in nodes.items()
    ]


def games_created(nodes: list[NodeSummary]) -> int:
    """Every game any node reports having created (dead nodes' games count: their games were
    gossiped as created and may already be synced elsewhere)."""
    return sum(n.games_created for n in nodes)


def training_spec(
    nodes: list[NodeSummary], records: dict[int, GenerationRecord], threshold: int, ttl: float
) -> WorkSpec | None:
    """The training item for the next generation, or None while too few new games exist."""
    last = latest(records)
    mark = last.games_mark if last else 0
    total = games_created(nodes)
    if total - mark < threshold:
        return None
    generation = last.generation + 1 if last else 1
    best = latest_promoted(records)
    needs_gpu = any(n.alive and n.gpus > 0 for n in nodes)
    return WorkSpec(
        kind=TRAINING_KIND, key=f"generation-{generation}",
        payload={"generation": generation, "games_mark": total,
                 "parent_sha256": best.sha256 if best else None},
        requirements={"needs_gpu": True} if needs_gpu else {},
        priority=10, ttl=ttl,
    )


def schedule(
    nodes: list[NodeSummary], records: dict[int, GenerationRecord], threshold: int, ttl: float
) -> list[WorkSpec]:
    spec = training_spec(nodes, records, threshold, ttl)
    return [] if spec is None else [spec]
