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

from app.coordination.pipeline.gauntlet_plan import GAUNTLET_KIND, REQUEST_KEY, RESULTS_KEY, GauntletRequest, shards_of
from app.coordination.pipeline.generation_log import GenerationRecord, latest, trainer_head
from app.coordination.p2p.work_rules import PREFER_KEYS, TRAINING_JOIN_KIND, TRAINING_KIND, WorkSpec

STAY_PREFER_S = 20.0  # how long the next generation's training waits for the node whose trainer stays


@dataclass(frozen=True)
class NodeSummary:
    """The part of a node's gossip the scheduler reads."""

    node_id: str
    alive: bool
    games_created: int
    gpus: int
    # `train_rendezvous` this node gossips while it holds the training claim it names, else None
    rendezvous: dict[str, Any] | None = None


def summarize(nodes: Mapping[str, Any], alive_ids: set[str]) -> list[NodeSummary]:
    """NodeSummary per gossiped NodeState (pure: reads the given objects only)."""
    return [
        NodeSummary(
            node_id=nid, alive=nid in alive_ids,
            games_created=int(state.inventory.get("games_created", 0) or 0),
            gpus=int(state.capabilities.get("gpus", 0) or 0),
            rendezvous=held_rendezvous(state.inventory, [c.item_id for c in getattr(state, "claims", [])]),
        )
        for nid, state in nodes.items()
    ]


def games_created(nodes: list[NodeSummary]) -> int:
    """Every game any node reports having created (dead nodes' games count: their games were
    gossiped as created and may already be synced elsewhere)."""
    return sum(n.games_created for n in nodes)


def new_since_last_generation(nodes: list[NodeSummary], records: dict[int, GenerationRecord]) -> int:
    """Items created since the newest decided generation was claimed: the next generation is
    due at the threshold, and a node that sees it due needs to make no more for it."""
    last = latest(records)
    return games_created(nodes) - (last.games_mark if last else 0)


def training_spec(
    nodes: list[NodeSummary], records: dict[int, GenerationRecord], threshold: int, ttl: float,
    max_nodes: int = 1, span_cpu_nodes: bool = False, requirements: Mapping[str, Any] | None = None,
    trainer_stays: bool = False,
) -> WorkSpec | None:
    """The training item for the next generation, or None while too few new games exist;
    its payload's `nnodes` says how many nodes the claimant should span (span_nnodes);
    `requirements`: the config's own (configs' `requires`), over the GPU rule. `trainer_stays`
    (a workload whose trainer stays between generations, the LM's): the node that trained the
    last generation, when alive, has the item to itself for STAY_PREFER_S seconds, so the
    trainer it holds trains on, as it would on a lone node; after that anyone who fits."""
    if new_since_last_generation(nodes, records) < threshold:
        return None
    last = latest(records)
    total = games_created(nodes)
    generation = last.generation + 1 if last else 1
    parent = trainer_head(records)  # the best, or the trainer's head where the workload runs on
    needs_gpu = any(n.alive and n.gpus > 0 for n in nodes)
    nnodes = span_nnodes(nodes, max_nodes, span_cpu_nodes)
    stays = trainer_stays and last is not None and nnodes == 1 and any(
        n.alive and n.node_id == last.trained_by for n in nodes)
    return WorkSpec(
        kind=TRAINING_KIND, key=f"generation-{generation}",
        payload={"generation": generation, "games_mark": total,
                 "parent_sha256": parent.sha256 if parent else None, "nnodes": nnodes},
        requirements={**({"needs_gpu": True} if needs_gpu else {}), **(requirements or {}),
                      **({"prefer_nodes": [last.trained_by], "prefer_s": STAY_PREFER_S} if stays and last else {})},
        priority=10, ttl=ttl,
    )


def schedule(
    nodes: list[NodeSummary], records: dict[int, GenerationRecord], threshold: int, ttl: float,
    max_nodes: int = 1, span_cpu_nodes: bool = False, requirements: Mapping[str, Any] | None = None,
    trainer_stays: bool = False,
) -> list[WorkSpec]:
    spec = training_spec(nodes, records, threshold, ttl, max_nodes, span_cpu_nodes, requirements, trainer_stays)
    return [] if spec is None else [spec, *join_specs(nodes, spec)]


# -- one generation's training across several nodes ------------------------------------------
RENDEZVOUS_KEYS = ("generation", "item_id", "master_addr", "master_port", "nnodes", "dataset_sha256",
                   "parent_sha256", "run_id")


def span_nnodes(nodes: list[NodeSummary], max_nodes: int, span_cpu_nodes: bool) -> int:
    """How many nodes one generation's training spans: the live GPU nodes when any is alive,
    else every live node if CPU nodes may span, else one; never more than `max_nodes`."""
    alive = [n for n in nodes if n.alive]
    gpu = [n for n in alive if n.gpus > 0]
    eligible = len(gpu) if gpu else (len(alive) if span_cpu_nodes else 1)
    return max(1, min(max_nodes, eligible))


def held_rendezvous(inventory: Mapping[str, Any], claimed_item_ids: list[str]) -> dict[str, Any] | None:
    """The node's gossiped `train_rendezvous` when well formed and naming a claim the node still
    gossips as held: a claimant that lost its claim no longer draws joiners, even if its
    inventory lags."""
    rdzv = inventory.get("train_rendezvous")
    if not isinstance(rdzv, dict) or any(k not in rdzv for k in RENDEZVOUS_KEYS):
        return None
    if rdzv["item_id"] not in claimed_item_ids:
        return None
    options = rdzv.get("train_options")  # the quality loop's lr/batch (checked by each joiner)
    return {**{k: rdzv[k] for k in RENDEZVOUS_KEYS},
            **({"train_options": options} if isinstance(options, dict) and len(options) <= 2 else {})}


def join_specs(nodes: list[NodeSummary], training: WorkSpec) -> list[WorkSpec]:
    """Items `training_join:generation-<g>-<run>-rank-<k>` (k = 1..nnodes-1) for the live node that
    gossips a rendezvous for `training`: any other node may claim one and join as rank k. The
    run id is in the key: a second run of the generation (after a lost claim) draws new joiners."""
    hosts = sorted((n for n in nodes if n.alive and n.rendezvous is not None
                    and n.rendezvous["item_id"] == training.item_id
                    and n.rendezvous["generation"] == training.payload["generation"]),
                   key=lambda n: n.node_id)
    if not hosts:
        return []
    host = hosts[0]
    rdzv = host.rendezvous
    assert rdzv is not None
    generation = int(rdzv["generation"])
    requirements = {**{k: v for k, v in training.requirements.items() if k not in PREFER_KEYS},
                    "exclude_nodes": [host.node_id]}
    return [
        WorkSpec(kind=TRAINING_JOIN_KIND, key=f"generation-{generation}-{str(rdzv['run_id'])[:12]}-rank-{rank}",
                 payload={**rdzv, "claimant": host.node_id, "node_rank": rank},
                 requirements=requirements, priority=training.priority, ttl=training.ttl)
        for rank in range(1, int(rdzv["nnodes"]))
    ]


# -- gauntlet games spread over the nodes -----------------------------------------------------
def gauntlet_specs(
    inventories: Mapping[str, Mapping[str, Any]], alive_ids: set[str],
    records: dict[int, GenerationRecord], ttl: float,
) -> list[WorkSpec]:
    """Items `gauntlet:generation-<g>-<sha12>-<baseline>-<k>` for every live node's gauntlet request of
    an undecided generation, less the shards whose result some node (alive or not) already
    gossips for that candidate. Any node may claim them (POST /work/claim, kinds ["gauntlet"])."""
    published = {
        (iid, r.get("candidate_sha256"))
        for inv in inventories.values() if isinstance(inv.get(RESULTS_KEY), Mapping)
        for iid, r in inv[RESULTS_KEY].items() if isinstance(r, Mapping)
    }
    specs: list[WorkSpec] = []
    for nid in sorted(alive_ids & set(inventories)):
        raw = inventories[nid].get(REQUEST_KEY)
        if not isinstance(raw, Mapping):
            continue
        try:
            request = GauntletRequest.from_json(raw)
        except (KeyError, ValueError, TypeError, AttributeError):
            continue  # malformed gossip schedules nothing
        if request.claimant != nid or request.generation in records:
            continue
        for shard in shards_of(request):
            if (shard.item_id, request.candidate_sha256) in published:
                continue
            specs.append(WorkSpec(
                kind=GAUNTLET_KIND, key=shard.item_key,
                payload={"generation": request.generation, "candidate_sha256": request.candidate_sha256,
                         "baseline": shard.baseline, "kind": shard.kind, "games": shard.games, "seed": shard.seed,
                         "net_simulations": request.net_simulations, "claimant": nid},
                priority=5, ttl=ttl, reopen_when_finisher_gone=True,
            ))
    return specs
