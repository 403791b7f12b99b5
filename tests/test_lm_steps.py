"""The LM workload's steps the daemons call (app/lm/workload/lm_steps.py), against real
files and loopback engine servers: the switch to a promoted model weight-syncs every HTTP
engine and /status shows each engine's version (a failed one with its reason); the decision
is recomputed from the stored per-prompt rewards, so a restart decides the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.config import Settings
from app.lm.workload.lm_engines import INIT_MODEL_DIR
from app.lm.workload.lm_steps import LMSteps
from app.coordination.pipeline.runner_settings import SelfplaySettings
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.state import PipelineState
from app.db.rollout_store import RolloutStore
from app.workloads import pipeline_context
import asyncio
import shutil

from tests.engine_stubs import SGLangStub

pytestmark = pytest.mark.timeout(60)


def lm_settings(tmp_path: Path, engines: list[dict]) -> Settings:
    return Settings.model_validate({"workload": "lm", "node": {"data_dir": str(tmp_path / "data")},
                                    "lm": {"engines": engines}})


async def test_a_switch_syncs_every_http_engine_and_status_shows_each_version(tmp_path: Path) -> None:
    good, bad = await SGLangStub().start(), await SGLangStub().start()
    bad.fail.add("/update_weights_from_disk")
    try:
        pipe = pipeline_context(lm_settings(tmp_path, [
            {"name": "local", "kind": "in_process"},
            {"name": "sg", "kind": "sglang", "url": good.url},
            {"name": "sg2", "kind": "sglang", "url": bad.url}]))
        assert isinstance(pipe.steps, LMSteps)
        before = pipe.steps.node_status(pipe)["lm_engines"]
        assert {name: e["weight_version"] for name, e in before.items()} == {"local": 0, "sg": 0, "sg2": 0}
        assert all(e["in_service"] is None for e in before.values())  # not built yet
        tokenizer = pipe.steps._task_kit()[0]
        # self-play builds the engines and syncs the servers to the initial model (its own thread)
        engine = await asyncio.to_thread(pipe.steps.engines.rollout_engine, None, 0, None, tokenizer)
        assert engine is not None and engine.name == "local"
        started = pipe.steps.node_status(pipe)["lm_engines"]
        assert started["sg"]["in_service"] is True and started["sg2"]["in_service"] is False

        model_dir = tmp_path / "models" / ("a" * 64)  # a real model directory: the initial one, copied
        shutil.copytree(tmp_path / "data" / INIT_MODEL_DIR, model_dir)
        await pipe.steps.models.switched("a" * 64, model_dir, 3)
    finally:
        await good.stop()
        await bad.stop()
    engines = pipe.steps.node_status(pipe)["lm_engines"]
    assert engines["local"]["weight_version"] == 3 and engines["local"]["sha256"] == "a" * 64
    assert engines["sg"] == {"kind": "sglang", "sync": "disk", "weight_version": 3, "sha256": "a" * 64,
                             "in_service": True}
    assert engines["sg2"]["in_service"] is False and "sg2" in engines["sg2"]["error"]
    assert engines["sg2"]["weight_version"] != 3
    update = good.bodies("/update_weights_from_disk")[-1]
    assert update["model_path"] == str(model_dir) and update["weight_version"] == "3"


def test_the_decision_is_the_paired_gate_on_the_stored_rewards(tmp_path: Path) -> None:
    pipe = pipeline_context(lm_settings(tmp_path, [{"name": "local", "kind": "in_process"}]))
    better = {"rewards": {"candidate": [1.0] * 10 + [0.0] * 2, "best": [0.0] * 10 + [0.0] * 2}}
    tied = {"rewards": {"candidate": [1.0, 0.0] * 6, "best": [0.0, 1.0] * 6}}
    promote = pipe.steps.decide(pipe, PipelineState(generation=2, evaluation=better), has_best=True)
    assert promote.promote and promote.summary().startswith("pass: better: 10 wins, 0 losses")
    reject = pipe.steps.decide(pipe, PipelineState(generation=2, evaluation=tied), has_best=True)
    assert not reject.promote and "not significant: 6 wins, 6 losses" in reject.summary()
    # the same stored evaluation decides the same after a restart (a fresh steps object)
    again = pipeline_context(lm_settings(tmp_path, [{"name": "local", "kind": "in_process"}]))
    assert again.steps.decide(again, PipelineState(generation=2, evaluation=better), True) == promote


async def test_the_dashboard_panel_shows_what_the_node_trains_from_and_the_held_out_reward(tmp_path: Path) -> None:
    pipe = pipeline_context(lm_settings(tmp_path, [{"name": "local", "kind": "in_process"}]))
    best, head = "b" * 64, "c" * 64
    summary = {"reward": 0.5, "interval": [0.4, 0.6], "exact_match": 0.5}
    (tmp_path / "data" / "heldout.json").write_text(json.dumps({
        "init": {"generation": 0, **summary, "reward": 0.0, "interval": [0.0, 0.1]}, best: {"generation": 1, **summary},
        head: {"generation": 2, **summary, "reward": 0.7, "interval": [0.6, 0.8]}}))
    state = PipelineState(generation=3, best_sha256=best, best_path="lm_models/b", best_generation=1)
    kept = ps.decided(ps.evaluated(ps.trained(ps.training_started(ps.exported(
        state, "d", "d" * 64, 0), str(tmp_path / "run")), "cand", head), {}), False, head_path="lm_models/c")
    await pipe.update(lambda _: kept)
    panel = pipe.steps.dashboard(pipe, {"peer": {"lm_trains_from": {"model": "best", "generation": 1, "sha256": best}},
                                        "game-node": {"games_created": 3}})
    rows = {r["node_id"]: r for r in panel["training"]}
    assert set(rows) == {pipe.node_id, "peer"}  # a node that says nothing of training has no row
    assert rows[pipe.node_id]["trains_from"] == {"model": "head", "generation": 3, "sha256": head}
    assert [(r["generation"], r["reward"], r["low"]) for r in panel["heldout"]] == [(0, 0.0, 0.0), (1, 0.5, 0.4), (2, 0.7, 0.6)]


def test_a_rejected_candidate_stays_the_trainers_head_unless_it_regressed_past_the_margin(tmp_path: Path) -> None:
    pipe = pipeline_context(lm_settings(tmp_path, [{"name": "local", "kind": "in_process"}]))
    tied = {"rewards": {"candidate": [1.0, 0.0] * 6, "best": [0.0, 1.0] * 6}}  # mean difference 0
    worse = {"rewards": {"candidate": [0.0] * 12, "best": [1.0] * 2 + [0.0] * 10}}  # 2/12 below the best
    for evaluation, kept in ((tied, True), (worse, False)):
        state = PipelineState(generation=2, evaluation=evaluation)
        verdict = pipe.steps.decide(pipe, state, True)
        assert not verdict.promote and pipe.steps.keeps_head(pipe, state, verdict) is kept
    everyone_from_best = pipeline_context(Settings.model_validate({
        "workload": "lm", "node": {"data_dir": str(tmp_path / "data2")}, "lm": {"eval": {"trains_from": "best"}}}))
    state = PipelineState(generation=2, evaluation=tied)
    assert not everyone_from_best.steps.keeps_head(everyone_from_best, state,
                                                   everyone_from_best.steps.decide(everyone_from_best, state, True))


async def test_nothing_is_stored_from_a_server_whose_sync_failed_or_that_restarted(tmp_path: Path) -> None:
    """The first engine is an SGLang server: while its load fails self-play stores nothing; once
    a load succeeds the stored groups carry the version the server reported; a server that came
    back with its old weights is caught at its next answer, that batch is not stored, and the
    next batch syncs it again first."""
    server = await SGLangStub().start()
    server.fail.add("/update_weights_from_disk")
    settings = Settings.model_validate({"workload": "lm", "node": {"data_dir": str(tmp_path / "data")}, "lm": {
        "engines": [{"name": "sg", "kind": "sglang", "url": server.url}],
        "task": {"name": "copy", "min_digits": 2, "max_digits": 2, "train_prompts": 32, "heldout_prompts": 8},
        "rollout": {"n": 2, "batch_groups": 2, "max_new_tokens": 3,  # the stub answers alike:
                    "zero_variance": "keep", "oversample": 1.0}}})  # its groups are kept as they come
    pipe = pipeline_context(settings)
    batch = SelfplaySettings()
    db = pipe.steps.paths.rollouts_db

    def stored() -> list:
        with RolloutStore(db) as store:
            return store.groups()

    try:
        refused = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert refused.items == 0 and stored() == [] and "/generate" not in server.paths()
        status = pipe.steps.node_status(pipe)["lm_engines"]["sg"]
        assert status["in_service"] is False and "no such path" in status["error"]

        server.fail.clear()
        pipe.steps.engines._next_try = 0.0  # the retry pause (RETRY_S) is over
        ok = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert ok.items == 2 and len(stored()) == 2
        assert all(g.weight_version == 0 for g in stored())  # what the server said it loaded
        assert server.bodies("/update_weights_from_disk")[-1]["model_path"] == str(tmp_path / "data" / INIT_MODEL_DIR)

        server.restart()  # back with the weights it was started with
        generated = server.paths().count("/generate")
        caught = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert caught.items == 0 and len(stored()) == 2  # its answers were refused, nothing stored
        assert server.paths().count("/generate") > generated
        assert pipe.steps.node_status(pipe)["lm_engines"]["sg"]["in_service"] is False
        loads = len(server.bodies("/update_weights_from_disk"))
        again = await asyncio.to_thread(pipe.steps.selfplay_batch, pipe, batch, lambda: False)
        assert len(server.bodies("/update_weights_from_disk")) == loads + 1  # synced again first
        assert again.items == 2 and len(stored()) == 4
    finally:
        await server.stop()
        pipe.steps.close()
