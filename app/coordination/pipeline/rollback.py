"""Rolling the cluster's best model back: a decision committed through the voter quorum, like
a promotion, never an edit on each node.

`rollback/<g>` says "generation g's promotion is withdrawn". The leader decides it through
the same single-decree quorum as `generation/<g>` (p2p/decision.py, via `MeshNode.decide`), so a
second operator, a retry after a leader kill, or a new leader all get the value first decided
for that key, and no node can hold two answers. Nodes learn rollbacks the way they learn
generations: the voters from `/commit/decided`, everyone from gossip (`rollbacks` in the
inventory), persisted in `rollbacks.json`. The cluster's best is then the newest promoted
generation not rolled back (`effective_records`): distribution switches every node to it,
and the next generation trains from it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from app.atomic_files import atomic_write_json
from app.coordination.p2p.server import BadRequest, parse_body
from app.coordination.pipeline.generation_log import GenerationRecord, latest_promoted
from app.coordination.p2p.node import MeshNode
from app.log import get_logger

log = get_logger(__name__)
ROLLBACK_PREFIX = "rollback/"


@dataclass(frozen=True)
class RollbackRecord:
    generation: int  # the promoted generation withdrawn
    reason: str
    by: str  # the leader that decided it

    def key(self) -> str:
        return f"{ROLLBACK_PREFIX}{self.generation}"

    def to_value(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @staticmethod
    def from_value(value: str | dict) -> "RollbackRecord":
        data = json.loads(value) if isinstance(value, str) else value
        return RollbackRecord(int(data["generation"]), str(data.get("reason", "")), str(data.get("by", "")))


class RollbackLog:
    """The decided rollbacks this node knows, one per generation, persisted atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.records: dict[int, RollbackRecord] = {}
        if self.path.exists():
            self.records = {int(r["generation"]): RollbackRecord.from_value(r) for r in json.loads(self.path.read_text())}

    def merge(self, incoming: list[RollbackRecord]) -> list[str]:
        """Add new ones; a record contradicting one held is refused and reported."""
        conflicts, changed = [], False
        for record in incoming:
            mine = self.records.get(record.generation)
            if mine is None:
                self.records[record.generation] = record
                changed = True
            elif mine != record:
                conflicts.append(f"rollback of generation {record.generation}: holding {mine}, refused {record}")
        if changed:
            atomic_write_json(self.path, self.to_json(), indent=1)
        return conflicts

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(self.records[g]) for g in sorted(self.records)]


def effective_records(records: dict[int, GenerationRecord], rolled_back: set[int] | dict) -> dict[int, GenerationRecord]:
    """Pure: the generation records as the pipeline should act on them: a rolled-back
    generation counts as not promoted (its number stays taken), and a trainer's head that ran
    on from it (a later `head` record before the next promotion) is no head to train from."""
    out: dict[int, GenerationRecord] = {}
    from_rolled_back = False  # the newest promoted generation so far was rolled back
    for g in sorted(records):
        r = records[g]
        if r.promoted:
            from_rolled_back = g in rolled_back
            if from_rolled_back:
                r = replace(r, promoted=False, reason=f"rolled back; {r.reason}"[:500])
        elif r.head and from_rolled_back:
            r = replace(r, head=False)
        out[g] = r
    return out


def plan_rollback(records: dict[int, GenerationRecord], rolled_back: set[int] | dict,
                  generation: int | None) -> tuple[int | None, str]:
    """Pure: (the generation to roll back, "") or (None, why not). Default: the current best;
    there must be an earlier promoted generation (or the uniform start) to return to."""
    effective = effective_records(records, rolled_back)
    best = latest_promoted(effective)
    target = generation if generation is not None else (best.generation if best else None)
    if target is None:
        return None, "no promoted generation to roll back"
    record = records.get(target)
    if record is None or not record.promoted:
        return None, f"generation {target} was not promoted"
    if target in rolled_back:
        return target, ""  # already decided: deciding again returns the same value
    if best is None or best.generation != target:
        return None, f"generation {target} is not the current best (generation {best.generation if best else 0})"
    if latest_promoted({g: r for g, r in effective.items() if g < target}) is None:
        return None, f"no promoted generation before {target} to return to"
    return target, ""


class RollbackHost(Protocol):
    """What the handler needs of the cluster pipeline (ClusterPipeline is one)."""

    node: MeshNode
    rollbacks: RollbackLog

    @property
    def generations(self) -> Any: ...
    def target_best(self) -> GenerationRecord | None: ...


class RollbackRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    generation: int | None = Field(default=None, ge=1, le=2**31)
    reason: str = Field(default="operator rollback", max_length=500)


def rollback_routes(cluster: RollbackHost) -> list[web.RouteDef]:
    """POST /pipeline/rollback (signed): the leader decides `rollback/<g>` through a quorum."""

    async def handle(request: web.Request) -> web.Response:
        try:
            body = parse_body(request, RollbackRequest)
        except BadRequest as exc:
            return web.json_response({"error": str(exc)}, status=400)
        node = cluster.node
        if not node.is_leader or not node.consensus.can_mutate():
            return web.json_response({"error": "not the leader" if not node.is_leader else "no quorum",
                                      "leader": node.leader_id,
                                      "leader_addr": node.addr_of(node.leader_id) if node.leader_id else None},
                                     status=503)
        target, why = plan_rollback(cluster.generations.records, cluster.rollbacks.records, body.generation)
        if target is None:
            return web.json_response({"error": why}, status=409)
        proposal = RollbackRecord(target, body.reason, node.node_id)
        held = cluster.rollbacks.records.get(target)
        decided = await node.decide(proposal.key(), held.to_value() if held else proposal.to_value())
        if decided is None:
            return web.json_response({"error": "no quorum stored the rollback"}, status=503)
        record = RollbackRecord.from_value(decided)
        cluster.rollbacks.merge([record])
        best = cluster.target_best()
        log.info("rollback_committed", generation=target, best_generation=best.generation if best else 0)
        return web.json_response({
            "rolled_back": target, "record": asdict(record), "already": decided != proposal.to_value(),
            "best_generation": best.generation if best else 0, "best_sha256": best.sha256 if best else None})

    return [web.post("/pipeline/rollback", handle)]
