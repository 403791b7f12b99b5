"""The leader's pure decisions about a generation: when to schedule training, for whom, and
which decided records a node accepts."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings, strategies as st

from app.coordination.pipeline.generation_log import GenerationLog, GenerationRecord, latest_promoted, merge_records
from app.coordination.p2p.work_rules import fits
from app.coordination.pipeline.scheduling import (
    STAY_PREFER_S, NodeSummary, games_created, new_since_last_generation, schedule, training_spec,
)

SHA = ["a" * 64, "b" * 64, "c" * 64]


def record(generation: int, sha: str, promoted: bool = True, mark: int = 0) -> GenerationRecord:
    return GenerationRecord(generation, sha, promoted, mark, "n0")


def nodes(*games: int, gpus: tuple[int, ...] = (), alive: tuple[bool, ...] = ()) -> list[NodeSummary]:
    return [NodeSummary(f"n{i}", alive[i] if alive else True, g, gpus[i] if gpus else 0) for i, g in enumerate(games)]


def test_training_is_scheduled_once_enough_games_exist_cluster_wide() -> None:
    assert schedule(nodes(30, 30, 39), {}, threshold=100, ttl=60) == []
    (spec,) = schedule(nodes(30, 30, 40), {}, threshold=100, ttl=60)
    assert spec.kind == "training" and spec.key == "generation-1" and spec.item_id == "training:generation-1"
    assert spec.payload == {"generation": 1, "games_mark": 100, "parent_sha256": None, "nnodes": 1}
    assert spec.requirements == {} and spec.ttl == 60


def test_the_next_generation_counts_games_since_the_last_decision() -> None:
    records = {1: record(1, SHA[0], True, mark=100), 2: record(2, SHA[1], False, mark=250)}
    assert training_spec(nodes(100, 200), records, threshold=100, ttl=60) is None
    spec = training_spec(nodes(150, 200), records, threshold=100, ttl=60)
    assert spec.payload["generation"] == 3 and spec.payload["parent_sha256"] == SHA[0]  # the rejected one is no parent
    # ... unless it was kept as the trainer's head (a language model's GRPO runs on from it)
    records[2] = replace(records[2], head=True)
    assert training_spec(nodes(150, 200), records, threshold=100, ttl=60).payload["parent_sha256"] == SHA[1]
    # what a non-training LM node reads to rest its self-play (lm_steps._enough_for_now)
    assert new_since_last_generation(nodes(100, 200), records) == 50
    assert new_since_last_generation(nodes(150, 200), records) == 100
    assert new_since_last_generation(nodes(7), {}) == 7


def test_the_next_generation_waits_a_while_for_the_node_whose_trainer_stays() -> None:
    """A workload whose trainer stays between generations (the LM's): the node that trained the
    last one has the next to itself for a while, so its trainer trains on; then anyone."""
    records = {1: GenerationRecord(1, SHA[0], True, 100, "n1")}
    spec = training_spec(nodes(150, 100), records, threshold=100, ttl=60, trainer_stays=True)
    assert spec is not None and spec.requirements == {"prefer_nodes": ["n1"], "prefer_s": STAY_PREFER_S}
    assert fits(spec.requirements, {}, "n1", age_s=0.0) and not fits(spec.requirements, {}, "n0", age_s=0.0)
    assert fits(spec.requirements, {}, "n0", age_s=STAY_PREFER_S)
    assert training_spec(nodes(150, 100, alive=(True, False)), records, 100, 60, trainer_stays=True).requirements == {}
    assert training_spec(nodes(150, 100), records, 100, 60).requirements == {}  # a trainer launched each time
    assert training_spec(nodes(150, 100, gpus=(1, 1)), records, 100, 60, max_nodes=2,
                         trainer_stays=True).requirements == {"needs_gpu": True}  # spanned: it does not stay


def test_a_live_gpu_node_makes_training_require_a_gpu() -> None:
    assert training_spec(nodes(50, 50, gpus=(0, 1)), {}, 100, 60).requirements == {"needs_gpu": True}
    dead_gpu = nodes(50, 50, gpus=(0, 1), alive=(True, False))
    assert training_spec(dead_gpu, {}, 100, 60).requirements == {}
    assert games_created(dead_gpu) == 100  # a dead node's games were created all the same


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 6), st.sampled_from(SHA), st.booleans()), max_size=12),
       st.lists(st.tuples(st.integers(1, 6), st.sampled_from(SHA), st.booleans()), max_size=12))
def test_merging_never_holds_two_records_for_one_generation(held_raw, incoming_raw) -> None:
    held: dict[int, GenerationRecord] = {}
    for g, sha, promoted in held_raw:
        held.setdefault(g, record(g, sha, promoted))
    incoming = [record(g, sha, promoted) for g, sha, promoted in incoming_raw]
    merged, conflicts = merge_records(held, incoming)
    for g, rec in held.items():
        assert merged[g] == rec  # what a node holds is never replaced
    for rec in incoming:
        assert merged[rec.generation] == rec or any(f"generation {rec.generation}:" in c for c in conflicts)
    assert set(merged) == set(held) | {r.generation for r in incoming}


def test_log_persists_and_refuses_a_contradiction(tmp_path) -> None:
    log = GenerationLog(tmp_path / "generations.json")
    assert log.merge([record(1, SHA[0]), record(2, SHA[1], False)]) == []
    assert latest_promoted(log.records).generation == 1
    conflicts = log.merge([record(1, SHA[2])])
    assert conflicts and "refused" in conflicts[0]
    again = GenerationLog(tmp_path / "generations.json")
    assert again.records == log.records and again.records[1].sha256 == SHA[0]
    assert GenerationRecord.from_value(record(3, SHA[1]).to_value()) == record(3, SHA[1])


def test_a_configs_requirements_ride_on_its_training_items_so_only_fitting_nodes_claim_them() -> None:
    """Issue 52 item 5: each node trains the configs its capabilities allow. A config's
    `requires` (e.g. an lm config needing 8 GB and 2 cores) is on its training item and the join
    items of a spanned run; a node whose gossiped capabilities do not fit never gets them."""
    from app.config.configs import ConfigRequires
    from app.coordination.p2p.work_rules import fits

    asks = ConfigRequires(min_memory_gb=8, min_cpus=2).work_requirements()
    assert asks == {"min_memory_gb": 8.0, "min_cpus": 2} and ConfigRequires().work_requirements() == {}
    (spec,) = schedule(nodes(60, 60), {}, threshold=100, ttl=60, requirements=asks)
    assert spec.requirements == asks
    assert training_spec(nodes(60, 60, gpus=(1, 0)), {}, 100, 60, requirements=asks).requirements == {
        "needs_gpu": True, **asks}
    assert fits(spec.requirements, {"cpus": 2, "memory_gb": 16.0})
    assert not fits(spec.requirements, {"cpus": 2, "memory_gb": 4.0}) and not fits(spec.requirements, {"cpus": 1, "memory_gb": 16.0})
