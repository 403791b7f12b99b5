"""The leader's pure decisions about spanning one generation's training over several nodes:
how many nodes, when join items exist, who may claim them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from app.coordination.p2p.work_rules import fits
from app.coordination.pipeline.scheduling import NodeSummary, schedule, span_nnodes, summarize

pytestmark = pytest.mark.timeout(30)


def nodes(n: int, gpus: tuple[int, ...] = (), alive: tuple[bool, ...] = (), games: int = 50,
          rendezvous: dict[int, dict] | None = None) -> list[NodeSummary]:
    return [NodeSummary(f"n{i}", alive[i] if alive else True, games, gpus[i] if gpus else 0,
                        (rendezvous or {}).get(i)) for i in range(n)]


def rdzv(generation: int = 1, nnodes: int = 3, item: str = "training:generation-1") -> dict:
    return {"generation": generation, "item_id": item, "master_addr": "10.0.0.1", "master_port": 29555,
            "nnodes": nnodes, "dataset_sha256": "d" * 64, "parent_sha256": None, "run_id": "r1"}


def test_nnodes_counts_live_gpu_nodes_else_cpu_nodes_only_when_allowed() -> None:
    assert span_nnodes(nodes(3), max_nodes=4, span_cpu_nodes=False) == 1
    assert span_nnodes(nodes(3), max_nodes=4, span_cpu_nodes=True) == 3
    assert span_nnodes(nodes(3), max_nodes=2, span_cpu_nodes=True) == 2
    assert span_nnodes(nodes(3, alive=(True, False, True)), 4, True) == 2  # the dead node is no candidate
    # GPU nodes alive: only they span, CPU nodes never join them, whatever span_cpu_nodes says.
    assert span_nnodes(nodes(4, gpus=(1, 0, 2, 0)), 4, True) == 2
    assert span_nnodes(nodes(4, gpus=(1, 0, 2, 1), alive=(True, True, True, False)), 4, False) == 2
    assert span_nnodes(nodes(2, gpus=(1, 1)), max_nodes=1, span_cpu_nodes=True) == 1


def test_the_training_item_carries_nnodes_and_no_join_item_exists_before_a_rendezvous() -> None:
    specs = schedule(nodes(3), {}, threshold=100, ttl=30, max_nodes=4, span_cpu_nodes=True)
    assert [s.item_id for s in specs] == ["training:generation-1"]
    assert specs[0].payload["nnodes"] == 3
    assert schedule(nodes(3), {}, threshold=100, ttl=30)[0].payload["nnodes"] == 1  # defaults: no spanning


def test_a_gossiped_rendezvous_adds_one_join_item_per_further_rank_excluding_the_claimant() -> None:
    cluster = nodes(3, rendezvous={1: rdzv(nnodes=3)})
    training, *joins = schedule(cluster, {}, threshold=100, ttl=30, max_nodes=4, span_cpu_nodes=True)
    assert training.item_id == "training:generation-1"
    assert [j.item_id for j in joins] == ["training_join:generation-1-r1-rank-1", "training_join:generation-1-r1-rank-2"]
    # a second run of the generation (its first claimant lost the claim) draws new joiners
    again = schedule(nodes(3, rendezvous={2: {**rdzv(nnodes=3), "run_id": "r2"}}), {}, 100, 30, 4, True)[1:]
    assert [j.item_id for j in again] == ["training_join:generation-1-r2-rank-1", "training_join:generation-1-r2-rank-2"]
    for rank, join in enumerate(joins, start=1):
        assert join.payload == {**rdzv(nnodes=3), "claimant": "n1", "node_rank": rank}
        assert join.requirements == {"exclude_nodes": ["n1"]} and join.ttl == 30
        assert not fits(join.requirements, {"cpus": 2}, "n1")
        assert fits(join.requirements, {"cpus": 2}, "n0") and fits(join.requirements, {"cpus": 2}, "n2")


def test_join_items_need_a_gpu_when_the_training_item_does() -> None:
    cluster = nodes(3, gpus=(1, 1, 0), rendezvous={0: rdzv(nnodes=2)})
    training, join = schedule(cluster, {}, threshold=100, ttl=30, max_nodes=4)
    assert training.requirements == {"needs_gpu": True}
    assert join.requirements == {"needs_gpu": True, "exclude_nodes": ["n0"]}
    assert not fits(join.requirements, {"gpus": 0}, "n2") and fits(join.requirements, {"gpus": 1}, "n1")


def test_no_join_items_for_a_dead_claimant_or_a_rendezvous_of_another_generation() -> None:
    dead = nodes(3, alive=(True, False, True), rendezvous={1: rdzv()})
    assert len(schedule(dead, {}, 100, 30, 4, True)) == 1
    stale = nodes(3, rendezvous={1: rdzv(generation=0, item="training:generation-0")})
    assert len(schedule(stale, {}, 100, 30, 4, True)) == 1
    alone = nodes(3, rendezvous={1: rdzv(nnodes=1)})
    assert len(schedule(alone, {}, 100, 30, 4, True)) == 1


def test_summarize_reads_a_rendezvous_only_while_the_node_gossips_the_claim_it_names() -> None:
    holding = SimpleNamespace(inventory={"games_created": 10, "train_rendezvous": rdzv()}, capabilities={},
                              claims=[SimpleNamespace(item_id="training:generation-1")])
    lost = SimpleNamespace(inventory={"games_created": 10, "train_rendezvous": rdzv()}, capabilities={}, claims=[])
    malformed = SimpleNamespace(inventory={"train_rendezvous": {"generation": 1}}, capabilities={},
                                claims=[SimpleNamespace(item_id="training:generation-1")])
    out = {s.node_id: s for s in summarize({"a": holding, "b": lost, "c": malformed}, {"a", "b", "c"})}
    assert out["a"].rendezvous == rdzv()
    assert out["b"].rendezvous is None and out["c"].rendezvous is None


def test_the_queue_never_hands_a_join_item_to_the_claimant(tmp_path) -> None:
    from app.coordination.p2p.work_queue import WorkQueue
    from app.coordination.p2p.work_rules import TRAINING_JOIN_KIND

    specs = schedule(nodes(2, rendezvous={0: rdzv(nnodes=2)}), {}, 100, 30, 4, True)
    queue = WorkQueue(tmp_path / "q.db", max_attempts=3, default_ttl=10.0)
    try:
        queue.rebuild(1, specs, [], now=0.0)
        assert queue.claim("n0", {"cpus": 2}, [TRAINING_JOIN_KIND], term=1, now=1.0) is None
        grant = queue.claim("n1", {"cpus": 2}, [TRAINING_JOIN_KIND], term=1, now=1.0)
        assert grant is not None and grant.item.item_id == "training_join:generation-1-r1-rank-1"
        assert grant.item.payload["master_port"] == 29555 and grant.item.payload["node_rank"] == 1
    finally:
        queue.close()


def test_only_a_multi_node_static_launch_gets_the_join_deadline(tmp_path) -> None:
    from app.shared.launcher import LaunchSpec, build_torchrun_argv

    spanned = build_torchrun_argv(LaunchSpec(["-m", "x"], 1, tmp_path, nnodes="2", node_rank=1,
                                             master_addr="10.0.0.1", master_port=29555, join_timeout_s=7.5), 29555)
    assert spanned[spanned.index("--rdzv-conf") + 1] == "timeout=8"
    assert spanned[spanned.index("--node-rank") + 1] == "1" and spanned[spanned.index("--master-port") + 1] == "29555"
    alone = build_torchrun_argv(LaunchSpec(["-m", "x"], 1, tmp_path, join_timeout_s=7.5), 29555)
    assert "--rdzv-conf" not in alone


def test_the_claimants_decided_lr_and_batch_reach_every_joiner_checked_against_its_bounds() -> None:
    """Issue 52: a spanned run trains with the quality loop's decided options on every rank:
    the claimant announces them in its rendezvous, the leader carries them into each join item,
    and a joiner takes them only within what the loop could have decided (else refuses)."""
    from app.config.pipeline import QualityLoopConfig, TrainConfig
    from app.coordination.pipeline.feedback_loops import checked_options

    options = {"lr": 0.001}
    cluster = nodes(3, rendezvous={1: {**rdzv(nnodes=2), "train_options": options}})
    _, join = schedule(cluster, {}, threshold=100, ttl=30, max_nodes=4, span_cpu_nodes=True)
    assert join.payload["train_options"] == options
    train, on = TrainConfig(lr=0.002, batch_size=64), QualityLoopConfig(enabled=True, min_scale=0.25)
    assert checked_options(join.payload["train_options"], train, on) == {"lr": 0.001}
    assert checked_options({"batch_size": 256}, train, on) == {"batch_size": 256}
    assert checked_options(None, train, on) == {} and checked_options({}, train, QualityLoopConfig()) == {}
    for bad in ({"lr": 0.0001}, {"lr": 0.01}, {"lr": float("nan")}, {"batch_size": 512}, {"batch_size": 32},
                {"batch_size": 64.5}, {"epochs": 3}, ["lr"]):
        with pytest.raises(ValueError):
            checked_options(bad, train, on)
    with pytest.raises(ValueError, match="quality is off"):
        checked_options(options, train, QualityLoopConfig())


def test_the_spanned_claimant_and_its_joiner_launch_with_the_same_decided_options(tmp_path) -> None:
    """Both command lines of a spanned run carry the quality loop's decided lr (the claimant's
    from its state, the joiner's from the join item)."""
    from dataclasses import replace

    import yaml

    from app.config import load_settings
    from app.coordination.pipeline.feedback_loops import Feedback, TrainingDecision
    from app.coordination.pipeline.train_join import join_command
    from app.coordination.pipeline.training_job import SpanArgs, rendezvous_record, training_command
    from app.coordination.pipeline.feedback_apply import train_options
    from app.workloads import pipeline_context

    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"node": {"data_dir": str(tmp_path / "data")}, "train": {"lr": 0.004},
                                    "feedback": {"quality": {"enabled": True}}}))
    pipe = pipeline_context(load_settings(path), config_path=path)
    state = replace(pipe.state, generation=3, run_dir=str(tmp_path / "run"), dataset_dir=str(tmp_path / "ds"),
                    feedback=Feedback(training=TrainingDecision(scale=0.5)).to_json())
    assert train_options(pipe, state) == {"lr": 0.002}
    span = SpanArgs(2, 0, "127.0.0.1", 29555, 5.0)
    claimant = training_command(pipe, state, 1, span)
    assert claimant[claimant.index("--lr") + 1] == "0.002"
    payload = {**rendezvous_record(state, "training:generation-3", "127.0.0.1", 29555, 2, train_options(pipe, state)),
               "claimant": "n0", "node_rank": 1}
    joiner = join_command(pipe, payload, run_dir=tmp_path / "join", dataset_dir=tmp_path / "ds", parent=None,
                          span=replace(span, node_rank=1))
    assert joiner[joiner.index("--lr") + 1] == "0.002" and "--batch-size" not in joiner
