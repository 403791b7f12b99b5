"""The pipeline across the mesh: what a node gossips, the leader's side of a generation, and
the worker's side (claim, renew, propose the decision).

One generation, clustered:
  leader   schedules `training:generation-<g>` once enough games exist (app/coordination/scheduling)
  worker   claims it (/work/claim_training), pulls games from peers, exports, trains, runs the
           gauntlet, installs a promoted candidate in its model store (so peers can fetch it),
           then proposes the decision: POST /pipeline/decision with its fencing token
  leader   checks the token, commits `generation/<g>` through a quorum of voters, answers
  worker   completes the claim, records the decision; every node sees the record in gossip and
           its distribution daemon fetches a promoted model by sha256 from a peer that has it
A decided record (generation or rollback) is applied only with its decision certificate, the
signed acks of a majority of the voters (app/coordination/p2p/quorum_cert.py): the leader's
answer and every node's gossip (`decided`) carry it, and a record gossiped without one, or with
one that does not check, is refused and counted (`decided_without_certificate`).
A stale token (the leader changed, the claim lapsed) gets 409 and the worker drops the
generation; the new leader schedules it again from the same gossiped state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from app.coordination.pipeline.shard_board import ShardBoard
from app.coordination.pipeline.generation_log import (
    COMMIT_PREFIX, GenerationLog, GenerationRecord, latest_promoted, trainer_head,
)
from app.coordination.p2p.node import ClusterView, MeshNode
from app.coordination.p2p.schemas import Token
from app.coordination.p2p.server import BadRequest, parse_body, same_sender
from app.coordination.p2p.worker import Claim, WorkClient
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.feedback_apply import feedback_status
from app.coordination.pipeline.steps import GenerationClaim, ReportsStatus
from app.coordination.pipeline.generation_stats import generation_stats
from app.coordination.pipeline.rollback import (
    ROLLBACK_PREFIX, RollbackLog, RollbackRecord, effective_records, rollback_routes,
)
from app.coordination.pipeline.scheduling import gauntlet_specs, new_since_last_generation, schedule, summarize
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.log import get_logger

log = get_logger(__name__)
RECORDS_GOSSIPED = 100
DECIDED_PREFIXES = (COMMIT_PREFIX, ROLLBACK_PREFIX)


class DecisionRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    node_id: str = Field(min_length=1, max_length=128)
    item_id: str = Field(max_length=512)
    token: Token
    record: dict[str, Any]


class ClusterPipeline:
    def __init__(self, node: MeshNode, pipe: PipelineContext) -> None:
        self.node = node
        self.pipe = pipe
        self.generations = GenerationLog(pipe.paths.data_dir / "generations.json")
        self.rollbacks = RollbackLog(pipe.paths.data_dir / "rollbacks.json")  # quorum-decided (rollback.py)
        self.work: WorkClient | None = None
        self.current: GenerationClaim | None = None
        self._renewer: asyncio.Task | None = None
        self._claim_lost = asyncio.Event()
        self.gauntlet = ShardBoard(pipe.paths.data_dir / "gauntlet_results.json")  # spread gauntlets
        self.rendezvous: dict[str, Any] | None = None  # gossiped while this node hosts a spanned run
        self.replication: dict[str, Any] | None = None  # the replication daemon's latest counts
        self.readiness: Callable[[], tuple[bool, str]] | None = None  # this node's /readyz (the orchestrator's)
        # several configs on the node: which config this lineage is and the allocation (/status)
        self.extra_inventory: Callable[[], dict[str, Any]] | None = None

    # -- what this node gossips, and what it learns -----------------------------------
    def inventory(self) -> dict[str, Any]:
        steps = self.pipe.steps
        state = self.pipe.state
        return {
            **steps.items.created_counts(self.pipe.node_id),  # games_created, positions_created, games_max_id
            **(steps.node_status(self.pipe) if isinstance(steps, ReportsStatus) else {}),  # lm: its engines
            "quorum_level": self.node.quorum_level.value,  # for other nodes' dashboards
            **self._readiness(),
            "gen_stats": generation_stats(self.pipe.paths),  # Elo interval and loss per model sha
            **({"work": self.node.queue.summary()} if self.node.is_leader else {}),
            "models": steps.models.installed(),
            "best_sha256": state.best_sha256, "best_generation": state.best_generation,
            "feedback": feedback_status(self.pipe),  # the feedback loops' decisions and why
            "generations": self.generations.to_json()[-RECORDS_GOSSIPED:],  # to read; applied only as `decided`
            "rollbacks": self.rollbacks.to_json()[-RECORDS_GOSSIPED:],
            "decided": self.node.decided_for_gossip(DECIDED_PREFIXES, RECORDS_GOSSIPED),
            **self.gauntlet.inventory(),
            **({"train_rendezvous": self.rendezvous} if self.rendezvous is not None else {}),
            **({"replication": self.replication} if self.replication is not None else {}),
            **(self.extra_inventory() if self.extra_inventory is not None else {}),
        }

    def _readiness(self) -> dict[str, Any]:
        if self.readiness is None:
            return {}
        ready, reason = self.readiness()
        return {"ready": ready, "ready_reason": reason[:200]}

    def absorb(self, view: ClusterView) -> None:
        """Learn the decided values peers pass on with their certificates (a record without a
        valid one is refused, counted and never applied), then merge every decided generation
        and rollback record this node holds the proof of."""
        commits = getattr(self.node, "commits", None)
        if commits is None:
            return
        for state in view.nodes.values():
            if state.node_id != self.node.node_id and state.inventory.get("decided"):
                self.node.learn_decided(state.node_id, state.inventory["decided"])
        decided = commits.decided_values()
        incoming = [GenerationRecord.from_value(v) for k, v in decided.items() if k.startswith(COMMIT_PREFIX)]
        for conflict in self.generations.merge(incoming):
            log.error("generation_record_refused", detail=conflict)
        rollbacks = [RollbackRecord.from_value(v) for k, v in decided.items() if k.startswith(ROLLBACK_PREFIX)]
        for conflict in self.rollbacks.merge(rollbacks):
            log.error("rollback_record_refused", detail=conflict)

    async def recover_next_decision(self) -> None:
        """Leader: a predecessor may have had the next generation stored on a quorum and died
        before anyone gossiped it. Reading that key from a quorum (and finishing what it finds)
        brings the decision into the log before the generation would be trained again."""
        if not self.node.is_leader:
            return
        last = max(self.generations.records, default=0)
        decided = await self.node.decide(f"{COMMIT_PREFIX}{last + 1}", None)
        if decided is not None:
            record = GenerationRecord.from_value(decided)
            log.info("generation_recovered", generation=record.generation, sha256=record.sha256[:12])
            self.generations.merge([record])

    async def publish_loop(self, router: EventRouter | None = None, interval_s: float = 1.0) -> None:
        """Gossip this node's inventory and learn the cluster's decisions; a promotion learned
        here (decided by another node) is published as MODEL_PROMOTED on `router`."""
        announced = set(self.generations.records)  # known at start: distribution checks those itself
        while True:
            try:
                await self.recover_next_decision()
                self.absorb(self.node.cluster_view())
                inventory = await asyncio.to_thread(self.inventory)
                self.node.update_local_state(inventory=inventory)
                learned = sorted(set(self.generations.records) - announced)
                announced.update(learned)
                for generation in learned:
                    record = self.generations.records[generation]
                    if record.promoted and router is not None:
                        await router.publish(EventType.MODEL_PROMOTED, {
                            "generation": generation, "sha256": record.sha256,
                            "path": str(self.pipe.steps.models.installed_path(record.sha256))})
            except Exception:  # noqa: BLE001 - gossip content must never stop the node
                log.exception("inventory_publish_failed")
            await asyncio.sleep(interval_s)

    # -- leader side -------------------------------------------------------------------
    def work_source(self, view: ClusterView):
        self.absorb(view)
        alive = {s.node_id for s in view.alive()}
        train = self.pipe.settings.train
        return schedule(summarize(view.nodes, alive), self.effective_records(), self.pipe.export_threshold,
                        ttl=self.node.timing.claim_ttl, max_nodes=train.max_nodes,
                        span_cpu_nodes=train.span_cpu_nodes,
                        requirements=getattr(self.pipe, "requirements", None),
                        trainer_stays=self.pipe.steps.training.follow_flag is not None) + gauntlet_specs(
            {nid: s.inventory for nid, s in view.nodes.items()}, alive, self.effective_records(),
            ttl=self.node.timing.claim_ttl)

    def next_generation_due(self) -> bool:
        """Enough items exist cluster-wide for the next generation (as the leader's schedule
        counts them, from this node's view): a node making items only to start it may rest."""
        view = self.node.cluster_view()
        alive = {s.node_id for s in view.alive()}
        return new_since_last_generation(summarize(view.nodes, alive),
                                         self.effective_records()) >= self.pipe.export_threshold

    def routes(self) -> list[web.RouteDef]:
        return [web.post("/pipeline/decision", self._handle_decision), *rollback_routes(self)]

    async def _handle_decision(self, request: web.Request) -> web.Response:
        try:
            body = parse_body(request, DecisionRequest)  # the body the signature was checked on
            same_sender(request, body.node_id, "the proposing node")  # a signature proves the sender, not the body
            record = GenerationRecord.from_value(body.record)
        except BadRequest as exc:
            return web.json_response({"error": str(exc)}, status=400)
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"bad decision record: {exc}"}, status=400)
        node = self.node
        if not node.is_leader:
            return web.json_response({"error": "not the leader", "leader": node.leader_id}, status=503)
        refusal, _ = node.queue.renew(body.node_id, body.item_id, body.token, node.term,
                                      node.consensus.can_mutate(), time.monotonic())
        if refusal is not None:
            return web.json_response({"error": f"stale claim: {refusal}"}, status=409)
        held = self.generations.records.get(record.generation)
        decided = held.to_value() if held is not None else await node.decide(record.commit_key(), record.to_value())
        if decided is None:
            return web.json_response({"error": "no quorum stored the decision"}, status=503)
        self.generations.merge([GenerationRecord.from_value(decided)])
        if decided != record.to_value():
            return web.json_response({"error": f"generation {record.generation} already decided",
                                      "record": GenerationRecord.from_value(decided).__dict__}, status=409)
        log.info("generation_committed", generation=record.generation, sha256=record.sha256[:12],
                 promoted=record.promoted)
        return web.json_response({"committed": True, "decided": node.decided_for_gossip((record.commit_key(),), 1)})

    # -- worker side -------------------------------------------------------------------
    async def claim_generation(self) -> GenerationClaim | None:
        if self.current is not None:
            return self.current
        claim = await self.work_client().claim(training=True)
        if claim is None:
            return None
        payload = claim.item.payload
        self.current = GenerationClaim(claim, int(payload["generation"]), int(payload["games_mark"]))
        self._claim_lost.clear()
        self._renewer = asyncio.create_task(self._renew_loop(claim))
        log.info("generation_claimed", generation=self.current.generation, item=claim.item.item_id)
        return self.current

    async def _renew_loop(self, claim: Claim) -> None:
        outcome = await self.work_client().keep_alive(claim)
        log.warning("generation_claim_lost", item=claim.item.item_id, reason=outcome.reason)
        self._claim_lost.set()

    async def propose(self, record: GenerationRecord) -> tuple[bool, str]:
        """Ask the leader to commit `record`; (committed, why not). Releases the claim either way."""
        current = self.current
        if current is None:
            return False, "no claim held"
        body = DecisionRequest(node_id=self.node.node_id, item_id=current.claim.item.item_id,
                               token=current.claim.token, record=record.__dict__)
        why = "no answer from a leader"
        for _ in range(10):
            if self._claim_lost.is_set():
                why = "claim lost"
                break
            leader = await self.work.find_leader()
            if leader is not None:
                try:
                    status, data = await self.node.client.request("POST", leader, "/pipeline/decision", body)
                except Exception as exc:  # noqa: BLE001
                    status, data = 0, {"error": repr(exc)}
                if status == 200:
                    # applied here on the certificate the leader sent back (else when gossip brings it)
                    if record.commit_key() in self.node.learn_decided(
                            leader, data.get("decided") if isinstance(data, dict) else None):
                        self.generations.merge([record])
                    await self.work.complete(current.claim, {"sha256": record.sha256})
                    self._release()
                    return True, ""
                why = data.get("error", str(data)) if isinstance(data, dict) else str(data)
                if status == 409:
                    break
            await asyncio.sleep(0.5)
        self._release()
        return False, why

    async def release_for_shutdown(self) -> None:
        """Draining: hand a held claim back now rather than let it lapse at its TTL."""
        current = self.current
        if current is not None and self.work is not None:
            await self.work.fail(current.claim, "node draining")
        self._release()

    def announce_rendezvous(self, rendezvous: dict[str, Any] | None) -> None:
        """Gossip (or, with None, stop gossiping) the rendezvous of the spanned run this node
        hosts; the leader turns it into join items (scheduling.join_specs)."""
        self.rendezvous = rendezvous
        inventory = {k: v for k, v in self.node.membership.local.inventory.items() if k != "train_rendezvous"}
        if rendezvous is not None:
            inventory["train_rendezvous"] = rendezvous
        self.node.update_local_state(inventory=inventory)

    def work_client(self) -> WorkClient:
        """The node's one WorkClient: every claim it holds (training or join) is gossiped together."""
        if self.work is None:
            self.work = self.node.work_client()
        return self.work

    def _release(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
        self._renewer = None
        self.current = None
        self.rendezvous = None

    # -- everyone ----------------------------------------------------------------------
    def target_best(self) -> GenerationRecord | None:
        return latest_promoted(self.effective_records())

    def trainer_head(self) -> GenerationRecord | None:
        """What the next generation trains from (generation_log.trainer_head)."""
        return trainer_head(self.effective_records())

    def effective_records(self) -> dict[int, GenerationRecord]:
        """The decided generations with rolled-back promotions withdrawn (rollback.py)."""
        return effective_records(self.generations.records, self.rollbacks.records)

    def progress(self) -> dict[str, Any]:
        """GET /progress: the decided generations; the same on every node once gossip settles."""
        records = self.generations.to_json()
        best = self.target_best()
        return {"format": 1, "current_best": best.sha256 if best else None,
                "best_generation": best.generation if best else 0, "generations": records,
                "rolled_back": sorted(self.rollbacks.records)}
