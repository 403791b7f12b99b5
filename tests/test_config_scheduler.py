"""The scheduler across configs (pure) and the gate that applies it on a node: shares sum to
one, every config keeps the floor, a config held at no progress decays to the floor, a
regressing config is boosted until it recovers, a promotion recomputes at once; the events
and metrics of the three loops (Elo -> self-play, regression -> curriculum, promotion ->
rebalance) with a real event router, journal and Prometheus registry."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from app.cli.mesh_commands import config_progress, format_progress
from app.config import Settings
from app.config.configs import SchedulerConfig, lineage_settings
from app.coordination.daemons.event_journal import EventJournal
from app.coordination.daemons.event_router import EventRouter
from app.coordination.pipeline.config_scheduler import (
    ConfigHistory, Evaluation, allocate, evaluations, pick_next, regression,
)
from app.coordination.pipeline.lineage_gate import GatedLineage, LineageGate
from app.coordination.pipeline.state import PipelineState

pytestmark = pytest.mark.timeout(60)

CFG = SchedulerConfig()
elo = st.floats(-500, 3000, allow_nan=False)
history = st.builds(
    ConfigHistory, name=st.just("x"), weight=st.floats(0.1, 10),
    evaluations=st.lists(st.builds(Evaluation, cpu_hours=st.floats(0, 100), elo=elo), max_size=8).map(
        lambda evs: tuple(sorted(evs, key=lambda e: e.cpu_hours))),
    stale_hours=st.floats(0, 50))
histories = st.lists(history, min_size=1, max_size=6).map(
    lambda hs: [ConfigHistory(f"c{i}", h.weight, h.evaluations, h.stale_hours) for i, h in enumerate(hs)])
cfgs = st.builds(SchedulerConfig, floor=st.floats(0, 0.5), staleness_weight=st.floats(0, 1),
                 regression_boost=st.floats(1, 10), progress=st.booleans())


@settings(max_examples=100, deadline=None)
@given(histories, cfgs)
def test_shares_sum_to_one_and_every_config_keeps_the_floor(hs, cfg) -> None:
    allocation = allocate(hs, cfg)
    assert sum(allocation.shares.values()) == pytest.approx(1.0)
    floor = min(cfg.floor, 1.0 / len(hs))
    assert all(share >= floor - 1e-9 for share in allocation.shares.values())
    assert set(allocation.reasons) == {h.name for h in hs}


def climbing(rate: float, n: int = 4) -> tuple[Evaluation, ...]:
    return tuple(Evaluation(cpu_hours=float(i), elo=rate * i) for i in range(n))


@settings(max_examples=100, deadline=None)
@given(st.floats(0.0, 1e-3), st.floats(10, 500), st.floats(0.01, 0.3))
def test_a_config_held_at_no_progress_decays_to_the_floor(flat_rate, rate, floor) -> None:
    cfg = SchedulerConfig(floor=floor, staleness_weight=0.0)
    allocation = allocate([ConfigHistory("flat", evaluations=climbing(flat_rate)),
                           ConfigHistory("learning", evaluations=climbing(rate))], cfg)
    assert allocation.shares["flat"] == pytest.approx(floor, abs=(1 - 2 * floor) * flat_rate / rate + 1e-9)
    assert allocation.shares["learning"] > allocation.shares["flat"]
    assert "Elo/CPU-h" in allocation.reasons["flat"]


@settings(max_examples=50, deadline=None)
@given(st.floats(50, 400), st.floats(1.5, 10), st.floats(10, 300))
def test_a_regressing_config_is_boosted_until_it_recovers(drop, boost, rate) -> None:
    cfg = SchedulerConfig(regression_boost=boost, regression_margin_elo=30.0, staleness_weight=0.0)
    fell = (Evaluation(0.0, 0.0), Evaluation(1.0, 100.0), Evaluation(2.0, 200.0), Evaluation(3.0, 200.0 - drop))
    climber = ConfigHistory("b", evaluations=climbing(rate))
    boosted = allocate([ConfigHistory("a", evaluations=fell), climber], cfg)
    plain = allocate([ConfigHistory("a", evaluations=fell), climber], SchedulerConfig(
        regression_boost=1.0, regression_margin_elo=30.0, staleness_weight=0.0))
    assert boosted.regressing == ("a",) and "regressing" in boosted.reasons["a"]
    assert boosted.shares["a"] > plain.shares["a"]
    assert regression(fell, 30.0) == (pytest.approx(200.0 - drop), 200.0)
    assert allocate([ConfigHistory("a", evaluations=fell[:3]), climber], cfg).regressing == ()
    recovered = (*fell, Evaluation(4.0, 200.0))  # back within the margin: no boost any more
    assert regression(recovered, 30.0) is None
    assert allocate([ConfigHistory("a", evaluations=recovered), climber], cfg).regressing == ()


def test_weights_unmeasured_configs_and_the_deficit_pick() -> None:
    allocation = allocate([ConfigHistory("a", weight=3.0), ConfigHistory("b", weight=1.0)], CFG)
    assert allocation.shares["a"] > allocation.shares["b"]
    assert "not measured yet" in allocation.reasons["a"]
    assert pick_next({"a": 0.75, "b": 0.25}, {"a": 10.0, "b": 0.0}, ["a", "b"]) == "b"
    assert pick_next({"a": 0.75, "b": 0.25}, {"a": 10.0, "b": 10.0}, ["a", "b"]) == "a"
    assert pick_next({"a": 0.75, "b": 0.25}, {}, []) is None


def test_evaluations_follow_the_promoted_best_with_its_elo() -> None:
    gens = [{"generation": 1, "promoted": True, "elo": 10.0}, {"generation": 2, "promoted": False, "elo": 5.0},
            {"generation": 3, "promoted": True, "elo": None}, {"generation": 4, "promoted": True, "elo": 90.0,
                                                                 "rolled_back": True},
            {"generation": 5, "promoted": True, "elo": 60.0}]
    assert evaluations(gens, {1: 0.5, 5: 2.0}) == (Evaluation(0.5, 10.0), Evaluation(2.0, 60.0))


def test_configs_default_to_one_lineage_and_name_a_bad_key() -> None:
    [(entry, same)] = lineage_settings(Settings())
    assert entry.name == "connect4" and same == Settings()
    with pytest.raises(ValueError, match=r"configs\[1\]\.train: unknown key"):
        Settings.model_validate({"configs": [{"name": "a", "game": "connect4"},
                                             {"name": "b", "game": "connect4_5x4", "train": {"lr_x": 1}}]})
    with pytest.raises(ValueError, match="names must be unique"):
        Settings.model_validate({"configs": [{"name": "a", "game": "connect4"}, {"name": "a", "game": "othello"}]})


class _Pipe:
    def __init__(self) -> None:
        self.state = PipelineState()
        self.cluster = None


def test_gate_publishes_each_loop_with_its_metric_and_journal(tmp_path) -> None:
    async def scenario() -> None:
        router = EventRouter()
        EventJournal(tmp_path / "events.jsonl").subscribe(router)
        registry = CollectorRegistry()
        now = [1000.0]
        gens = {"a": [], "b": []}
        gate = LineageGate([GatedLineage("a", 1.0, _Pipe(), lambda: gens["a"]),
                            GatedLineage("b", 1.0, _Pipe(), lambda: gens["b"])],
                           SchedulerConfig(staleness_weight=0.0, min_change=0.0), tmp_path, "n1",
                           router=router, registry=registry, clock=lambda: now[0])

        def share(name: str) -> float:
            return registry.get_sample_value("mesh_config_share", {"node": "n1", "config": name})

        async def decided(name: str, generation: int, elo: float, cpu_s: float, trigger: str) -> None:
            gate.cpu_s[name] = cpu_s
            gens[name] = [*gens[name], {"generation": generation, "promoted": True, "elo": elo}]
            await gate.recompute(trigger)

        await gate.recompute("start")
        # Elo -> self-play: a learns fast, b not at all
        for i, (ea, eb) in enumerate([(0, 0), (100, 1), (200, 2), (300, 3)], start=1):
            await decided("a", i, ea, 3600.0 * i, "progress")
            await decided("b", i, eb, 3600.0 * i, "progress")
        assert share("a") > 0.9 and share("b") == pytest.approx(0.05, abs=0.01)
        # regression -> curriculum: b falls 100 below its peak
        await decided("b", 5, -100.0, 5 * 3600.0, "progress")
        assert gate.allocation.regressing == ("b",)
        assert registry.get_sample_value("mesh_config_regressing", {"node": "n1", "config": "b"}) == 1.0
        assert gate.status()["trigger"] == "regression"
        # promotion -> rebalance: the gate is woken at once
        gate.on_promoted("a")
        assert gate._wake.is_set() and gate._pending_trigger == "promotion"
        await gate.recompute(gate._pending_trigger)
        triggers = [json.loads(line)["payload"]["trigger"] for line in (tmp_path / "events.jsonl").read_text().splitlines()
                    if json.loads(line)["type"] == "allocation_changed"]
        assert {"start", "progress", "regression", "promotion"} <= set(triggers)
        for trigger in ("regression", "promotion"):
            assert registry.get_sample_value("mesh_config_allocation_changes_total", {"node": "n1", "trigger": trigger}) >= 1
        # the history survives a restart
        again = LineageGate([GatedLineage("a", 1.0, _Pipe(), lambda: []), GatedLineage("b", 1.0, _Pipe(), lambda: [])],
                            SchedulerConfig(), tmp_path, "n1")
        assert again.cpu_hours_at["a"][4] == pytest.approx(4.0)

    asyncio.run(scenario())


def test_gate_turns_follow_the_shares(tmp_path) -> None:
    async def scenario() -> None:
        gate = LineageGate([GatedLineage("a", 1.0, _Pipe(), list), GatedLineage("b", 1.0, _Pipe(), list)],
                           SchedulerConfig(), tmp_path, "n1")
        gate.allocation = allocate([ConfigHistory("a", weight=3.0), ConfigHistory("b", weight=1.0)],
                                   SchedulerConfig(staleness_weight=0.0, floor=0.0))
        played = {"a": 0, "b": 0}

        async def lineage(name: str) -> None:
            while sum(played.values()) < 40:
                async with gate.selfplay_turn(name) as used:
                    used(1)
                    gate.cpu_s[name] += 1.0  # a turn of one core-second, whatever the wall time
                    played[name] += 1
                await asyncio.sleep(0)

        await asyncio.wait_for(asyncio.gather(lineage("a"), lineage("b")), 10)
        # while both want turns, a gets three for each of b's
        assert 27 <= played["a"] <= 33, played
        assert gate.may_claim("a") != gate.may_claim("b")

    asyncio.run(scenario())


def test_each_config_lives_apart_and_the_first_where_one_config_always_did() -> None:
    settings = Settings.model_validate({
        "node": {"data_dir": "/d", "mesh_port": 9000}, "mesh": {"peers": ["n2@10.0.0.2:9000", "10.0.0.3:9000"]},
        "configs": [{"name": "c4", "game": "connect4"},
                    {"name": "small", "game": "connect4_5x4", "port_offset": 7, "search": {"simulations": 8}},
                    {"name": "oth", "game": "othello", "weight": 2.0}]})
    [(c4, first), (small, second), (oth, third)] = lineage_settings(settings)
    assert (str(first.node.data_dir), first.node.mesh_port, first.mesh.peers) == ("/d", 9000, settings.mesh.peers)
    assert (str(second.node.data_dir), second.node.mesh_port) == ("/d/configs/small", 9007)
    assert second.mesh.peers == ["n2@10.0.0.2:9007", "10.0.0.3:9007"]
    assert second.search.simulations == 8 and first.search.simulations == settings.search.simulations
    assert (third.node.game, third.node.mesh_port, oth.weight) == ("othello", 9200, 2.0)
    with pytest.raises(ValueError, match="keeps the node's mesh port"):
        Settings.model_validate({"configs": [{"name": "a", "game": "connect4", "port_offset": 5}]})
    with pytest.raises(ValueError, match="an lm node runs one lineage"):
        Settings.model_validate({"workload": "lm", "configs": [{"name": "a", "game": "connect4"}]})


def test_progress_of_one_config_for_the_cli() -> None:
    answer = {"generations": [], "configs": {"c4": {"game": "connect4", "generations": [{"generation": 1}]}},
              "allocation": {"shares": {"c4": 1.0}, "reasons": {"c4": "share 1.000: progress off"}}}
    assert config_progress(answer, None) == (200, answer)
    status, one = config_progress(answer, "c4")
    assert status == 200 and one["share"] == 1.0 and one["reason"].startswith("share") and one["generations"]
    assert config_progress(answer, "go")[1]["error"] == "no config 'go' on this node; it runs ['c4']"
    assert config_progress({"generations": []}, "c4")[0] == 404
    assert "config c4 (connect4): best generation 0, share 1.000" in format_progress(answer)


def test_a_node_with_several_configs_is_ready_only_when_every_config_is(tmp_path) -> None:
    from app.coordination.daemons.daemon_registry import build_registry
    from app.coordination.daemons.manager import DaemonManager
    from app.p2p_orchestrator import NodeHealth

    async def worker(ctx) -> None:
        ctx.mark_healthy()
        await ctx.stopping.wait()

    class Lineage:  # what NodeHealth reads of a lineage: its config and its real daemon manager
        def __init__(self, name: str) -> None:
            self.entry = type("Entry", (), {"name": name})()
            self.manager = DaemonManager(build_registry({"daemons": {"worker": {"critical": True}}},
                                                        {"worker": (worker, {})}).select("all"),
                                         router=EventRouter(), settings=Settings())

    async def scenario() -> None:
        first, second = Lineage("c4"), Lineage("small")
        health = NodeHealth([first, second])
        await first.manager.start()
        try:
            assert health.readiness().reason == "config small: starting"
            await second.manager.start()
            assert health.readiness().ready
            assert [d["name"] for d in health.daemon_states()] == ["worker", "small.worker"]
        finally:
            await first.manager.drain_and_stop(5)
            await second.manager.drain_and_stop(5)

    asyncio.run(scenario())
