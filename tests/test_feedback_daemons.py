"""Each feedback loop driven through the real pipeline daemons of one node, in process (real
replay DB, real export, a real torchrun training run, real self-play; for regression ->
curriculum the orchestrator's own two-config lineages and their gate): its trigger, then its
response: the event on the router, the metric, the decided value in the state file or the
allocation, and the next step using it."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.games.search.players import model_player_name
from app.config import load_settings
from app.config.configs import lineage_settings
from app.coordination.daemons.daemon_registry import DaemonContext, read_daemons
from app.coordination.daemons.event_router import Event, EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.feedback_apply import feedback_status
from app.coordination.pipeline.runner_settings import ExportSettings, Polled, SelfplaySettings, TrainSettings
from app.coordination.pipeline.runners import export_daemon, promote_daemon, selfplay_daemon, train_daemon
from app.coordination.pipeline.state import Stage
from app.coordination.daemons.metrics import Metrics
from app.db.registry import MatchGame, ModelRegistry
from app.db.replay_db import ReplayDB
from app.games import get_game
from app.log import get_logger
from app.p2p_orchestrator import _show_local_status, build_lineage, build_parser, configs_view, node_settings, wire_gate
from app.games.train.gauntlet import recompute_ratings
from app.games.train.gauntlet_baselines import anchor_player
from app.workloads import pipeline_context
from tests.train_fixtures import synthetic_game

pytestmark = pytest.mark.timeout(120)
SHA = "cd" * 32


def _node(tmp_path: Path, config: dict, export: ExportSettings | None = None):
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump({"node": {"data_dir": str(tmp_path / "data")}, "model": {"channels": 8, "blocks": 1},
                                    **config}))
    settings = load_settings(path)
    return pipeline_context(settings, config_path=path, export=export), EventRouter()


def _ctx(pipe, router: EventRouter, name: str, settings) -> DaemonContext:
    return DaemonContext(name=name, settings=settings, router=router, app_settings=pipe.settings,
                         stopping=asyncio.Event(), log=get_logger(f"test.{name}"), metrics=router.metrics)


def _collect(router: EventRouter, event_type: EventType) -> list[dict]:
    seen: list[dict] = []

    async def handler(event: Event) -> None:
        seen.append(event.payload.model_dump())

    router.subscribe(event_type, handler, name=f"test.{event_type.value}")
    return seen


async def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def _stop(ctx: DaemonContext, task: asyncio.Task) -> None:
    ctx.stopping.set()
    await asyncio.wait_for(task, 60)


async def test_poor_data_makes_the_next_training_gentler(tmp_path) -> None:
    """quality -> training: an export of repetitive games scores under `low`; the export daemon
    publishes TRAINING_ADJUSTED, sets the metrics, persists the scale, and the train daemon's
    torchrun run trains at the scaled learning rate."""
    export = ExportSettings(min_new_games=12, poll_s=0.2)
    pipe, router = _node(tmp_path, {
        "feedback": {"quality": {"enabled": True, "low": 0.75, "high": 0.85, "step": 0.5}},
        "train": {"lr": 0.004, "batch_size": 16, "epochs": 1, "max_steps": 2, "eval_every": 2},
        "export": {"augment": False, "holdout_fraction": 0.2}}, export)
    rng = np.random.default_rng(0)
    lines = [synthetic_game(f"line-{i}", rng, 1000.0 + i) for i in range(3)]
    with ReplayDB(pipe.paths.games_db) as db:  # each line played four times: three quarters duplicates
        db.add_games([replace(lines[i % 3], uid=f"g{i}", finished_at=2000.0 + i) for i in range(12)])
    adjusted = _collect(router, EventType.TRAINING_ADJUSTED)
    ectx = _ctx(pipe, router, "export", export)
    exporting = asyncio.create_task(export_daemon(pipe, ectx))
    try:
        await _until(lambda: adjusted, 60, "TRAINING_ADJUSTED")
    finally:
        await _stop(ectx, exporting)
    assert pipe.state.stage is Stage.EXPORTED
    manifest = json.loads((Path(pipe.state.dataset_dir) / "manifest.json").read_text())
    assert manifest["quality"]["duplicate_share"] == 0.75
    event = adjusted[0]
    assert event["scale"] == 0.5 and event["previous_scale"] == 1.0 and event["values"] == {"lr": 0.002}
    assert event["score"] < 0.75 and event["generation"] == 1
    metrics = router.metrics
    assert metrics.value("mesh_data_quality_score") == pytest.approx(event["score"])
    assert metrics.value("mesh_feedback_training_scale") == 0.5
    assert metrics.value("mesh_feedback_adjustments_total", loop="quality") == 1
    stored = ps.PipelineStateStore(pipe.paths.state_file).load()  # what a restart finds
    assert stored.feedback["quality"]["scale"] == 0.5 and "< low" in stored.feedback["quality"]["reason"]
    assert feedback_status(pipe)["quality"]["values"] == {"lr": 0.002}

    tctx = _ctx(pipe, router, "train", TrainSettings(poll_s=0.2, max_failures=1))
    training = asyncio.create_task(train_daemon(pipe, tctx))
    try:
        await _until(lambda: pipe.state.stage is Stage.TRAINED or training.done(), 100, "the training run")
    finally:
        await _stop(tctx, training)
    assert pipe.state.stage is Stage.TRAINED, training.exception() if training.done() else None
    run_dir = pipe.paths.runs_dir / "gen_0001"
    start = next(json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()
                 if json.loads(line)["event"] == "start")
    assert start["lr"] == pytest.approx(0.002) and start["batch_size"] == 16


def _candidate(pipe, generation: int) -> tuple[str, str]:
    """A tiny network saved as generation `generation`'s candidate and registered."""
    arch = Architecture.for_game(get_game("connect4"), 8, 1)
    path = pipe.paths.runs_dir / f"gen_{generation:04d}" / "candidate.safetensors"
    path.parent.mkdir(parents=True, exist_ok=True)
    save_model(new_model(arch, seed=generation), ModelMeta(arch, "connect4", generation, None, SHA), path)
    with ModelRegistry(pipe.paths.registry_db) as registry:
        return pipe.steps.models.register_candidate(registry, path, generation), str(path)


async def _evaluated_generation(pipe, router: EventRouter, loss: float) -> None:
    """Generation g trained (its run's result.json: `loss`) and evaluated with no games vs the best."""
    g = pipe.state.generation
    sha, path = _candidate(pipe, g)
    run_dir = Path(path).parent
    (run_dir / "result.json").write_text(json.dumps({"status": "completed", "best_holdout_loss": loss}))
    await pipe.update(lambda s: ps.exported(s, str(tmp_dataset(pipe, g)), SHA, g))
    await pipe.update(lambda s: ps.training_started(s, str(run_dir)))
    await pipe.update(lambda s: ps.trained(s, path, sha))
    await pipe.update(lambda s: ps.evaluated(s, {"match_id": f"m{g}", "player": sha[:12], "results": []}))
    await router.publish(EventType.EVALUATION_COMPLETED, {"generation": g, "candidate_sha256": sha,
                                                          "results": {}, "passed": True})


def tmp_dataset(pipe, generation: int) -> Path:
    return pipe.paths.datasets_dir / f"gen_{generation:04d}"


async def test_flat_losses_raise_the_noise_self_play_plays_with(tmp_path) -> None:
    """loss plateau -> exploration: two decided generations with flat final losses; the promote
    daemon publishes EXPLORATION_ADJUSTED, sets the metrics, persists the noise, and the
    self-play daemon's next games are searched with it (each game records its search)."""
    pipe, router = _node(tmp_path, {
        "feedback": {"plateau": {"enabled": True, "generations": 2, "tolerance": 0.05, "step": 0.1,
                                 "max_fraction": 0.45}},
        "search": {"simulations": 4}, "selfplay": {"workers": 0, "concurrent_games": 2, "random_opening_plies": 0}})
    adjusted = _collect(router, EventType.EXPLORATION_ADJUSTED)
    pctx = _ctx(pipe, router, "promote", Polled(poll_s=0.2))
    promoting = asyncio.create_task(promote_daemon(pipe, pctx))
    try:
        for loss in (1.00, 1.01):
            decided = pipe.state.decided
            await _evaluated_generation(pipe, router, loss)
            await _until(lambda: pipe.state.decided > decided, 30, "the promotion decision")
        await _until(lambda: adjusted, 30, "EXPLORATION_ADJUSTED")
    finally:
        await _stop(pctx, promoting)
    assert adjusted == [{"generation": 2, "dirichlet_fraction": pytest.approx(0.35), "previous": 0.25,
                         "reason": adjusted[0]["reason"]}] and "flat" in adjusted[0]["reason"]
    assert router.metrics.value("mesh_selfplay_dirichlet_fraction") == pytest.approx(0.35)
    assert router.metrics.value("mesh_feedback_adjustments_total", loop="plateau") == 1
    stored = ps.PipelineStateStore(pipe.paths.state_file).load()
    assert stored.feedback["plateau"]["fraction"] == pytest.approx(0.35)
    restarted = pipeline_context(pipe.settings, config_path=pipe.config_path)  # a restart reads the state file
    assert feedback_status(restarted)["plateau"] == feedback_status(pipe)["plateau"]
    assert feedback_status(restarted)["plateau"]["dirichlet_fraction"] == pytest.approx(0.35)

    sctx = _ctx(pipe, router, "selfplay", SelfplaySettings(batch_games=2, simulations=4, pause_while_evaluating=False))
    playing = asyncio.create_task(selfplay_daemon(pipe, sctx))
    try:
        await _until(lambda: pipe.newest_item_id() >= 2 or playing.done(), 60, "self-play games")
    finally:
        await _stop(sctx, playing)
    with ReplayDB(pipe.paths.games_db) as db:
        games = db.games()
    assert games and {round(g.search["dirichlet_fraction"], 9) for g in games} == {0.35}
    assert {g.model_sha256 for g in games} == {pipe.state.best_sha256}  # the promoted model played


async def _promoted_vs_anchor(lineage, record_games, g: int, wins: int, losses: int) -> None:
    """Generation g of `lineage` trained and evaluated: its games against the fixed anchor in
    the registry (as the gauntlet records them, ratings refitted), its results in the state;
    the lineage's real promote daemon then decides it (no gate configured: promoted)."""
    pipe = lineage.pipe
    sha, path = _candidate(pipe, g)
    record_games(pipe, sha, g, wins, losses)
    result = {"opponent": anchor_player(pipe.settings), "kind": "anchor", "wins": wins, "draws": 0, "losses": losses,
              "stopped": "fixed"}
    await pipe.update(lambda s: ps.exported(s, str(tmp_dataset(pipe, g)), SHA, g))
    await pipe.update(lambda s: ps.training_started(s, str(Path(path).parent)))
    await pipe.update(lambda s: ps.trained(s, path, sha))
    await pipe.update(lambda s: ps.evaluated(s, {"match_id": f"{g:016x}", "player": sha[:12], "results": [result]}))
    await lineage.router.publish(EventType.EVALUATION_COMPLETED, {"generation": g, "candidate_sha256": sha,
                                                                  "results": {}, "passed": True})
    await _until(lambda: pipe.state.best_sha256 == sha, 30, f"generation {g} promoted")


def _record_anchor_games(pipe, sha: str, g: int, wins: int, losses: int) -> None:
    sims = pipe.settings.gauntlet.net_simulations
    me, anchor = model_player_name(sha, sims), anchor_player(pipe.settings)
    games = [MatchGame(f"{g:016x}-{i}", f"{g:016x}", "connect4", me, anchor, 0 if i < wins else 1, "")
             for i in range(wins + losses)]
    with ModelRegistry(pipe.paths.registry_db) as registry:
        registry.add_match_games(games)
        recompute_ratings(registry, sims, anchor_player(pipe.settings))


async def test_a_config_whose_elo_falls_below_its_peak_gets_a_boosted_share_until_it_recovers(tmp_path) -> None:
    """regression -> curriculum through the orchestrator's own lineages on one node with two
    configs (build_lineage, wire_gate: their real promote daemons, routers, event journal,
    dashboard feeds and the gate's loop): config `a` promotes two generations that beat the
    fixed anchor, then a third that loses to it (promoted: no gate by default), so its Elo falls
    below its peak. The gate publishes ALLOCATION_CHANGED with trigger `regression`, `a`'s share
    is boosted over `b`'s, `mesh_config_regressing{config="a"}` is 1 on /metrics and the
    allocation in /status says so; a fourth generation back at the peak ends the boost."""
    cfg_path, daemons_path = tmp_path / "node.yaml", tmp_path / "daemons.yaml"
    cfg_path.write_text(yaml.safe_dump({
        "node": {"data_dir": str(tmp_path / "data"), "node_id": "n1", "mesh_port": 0},  # any free port, each config
        "model": {"channels": 8, "blocks": 1},
        "configs": [{"name": "a", "game": "connect4"}, {"name": "b", "game": "connect4_5x4"}],
        "scheduler": {"staleness_weight": 0.0, "interval_s": 0.5, "regression_margin_elo": 30.0,
                      "regression_boost": 3.0}}))
    daemons_path.write_text(yaml.safe_dump({"daemons": {"promote": {"critical": True, "settings": {"poll_s": 0.5}}}}))
    args = build_parser().parse_args(["--config", str(cfg_path), "--daemons", str(daemons_path)])
    settings = node_settings(args)
    daemons = read_daemons(daemons_path)
    metrics = Metrics(node="n1")
    lineages = [await build_lineage(args, entry, s, daemons, metrics if i == 0 else Metrics(node="n1", node_wide=False),
                                    own_file=True) for i, (entry, s) in enumerate(lineage_settings(settings))]
    metrics.add_configs("a", [("b", lineages[1].metrics)])
    gate = wire_gate(lineages, settings, metrics)
    a = lineages[0]
    changes = _collect(a.router, EventType.ALLOCATION_CHANGED)
    for lineage in lineages:
        await lineage.node.start()
    background = [asyncio.create_task(gate.run())]
    for lineage in lineages:
        background += [asyncio.create_task(lineage.feed.run(interval_s=0.2)),
                       asyncio.create_task(_show_local_status(lineage.pipe, lineage.node, None, gate, interval_s=0.2))]
    starting = [asyncio.create_task(x.manager.start()) for x in lineages]
    try:
        for g, (wins, losses) in enumerate(((6, 2), (7, 1)), 1):
            await _promoted_vs_anchor(a, _record_anchor_games, g, wins, losses)
        rated = lambda n: len([g for g in a.feed.config_progress()["generations"] if g.get("elo") is not None]) >= n  # noqa: E731
        await _until(lambda: rated(2) and len(gate.cpu_hours_at["a"]) == 2, 30, "both generations rated and seen")
        await gate.recompute("progress")
        assert not gate.allocation.regressing and gate.allocation.shares["a"] == pytest.approx(0.5)
        await _promoted_vs_anchor(a, _record_anchor_games, 3, 1, 7)  # falls far below its peak
        await _until(lambda: any(e["trigger"] == "regression" for e in changes), 30, "ALLOCATION_CHANGED (regression)")
        event = next(e for e in changes if e["trigger"] == "regression")
        assert event["regressing"] == ["a"] and "regressing" in event["reasons"]["a"] and "boost x3" in event["reasons"]["a"]
        assert event["shares"]["a"] == pytest.approx(0.05 + 0.9 * 3 / 4) and event["shares"]["b"] == pytest.approx(0.05 + 0.9 / 4)
        journal = [json.loads(line) for line in (a.pipe.paths.events_file).read_text().splitlines()]
        assert any(e["type"] == "allocation_changed" and e["payload"]["trigger"] == "regression" for e in journal)
        text = metrics.render().decode()
        assert 'mesh_config_regressing{config="a",node="n1"} 1.0' in text
        assert 'mesh_config_regressing{config="b",node="n1"} 0.0' in text
        await _until(lambda: (a.node.status()["inventory"].get("config_allocation") or {}).get("regressing") == ["a"],
                     10, "the regression in /status")
        assert configs_view(lineages, gate)["allocation"]["regressing"] == ["a"]  # /progress and the dashboard
        await _promoted_vs_anchor(a, _record_anchor_games, 4, 7, 1)  # back at its peak: recovered
        await _until(lambda: not gate.allocation.regressing, 30, "the boost ended")
        assert gate.allocation.shares["a"] == pytest.approx(0.5)
    finally:
        for task in background:
            task.cancel()
        await asyncio.gather(*background, return_exceptions=True)
        await asyncio.gather(*(x.manager.drain_and_stop(10) for x in lineages))
        await asyncio.gather(*starting, return_exceptions=True)
        for lineage in lineages:
            await lineage.node.stop()
            lineage.pipe.steps.close()
            lineage.dead_letters.close()
