"""The feedback loops' pure decisions (app/coordination/pipeline/feedback_loops.py): bounds never
exceeded, hysteresis, no oscillation on constant input, and their state surviving a restart."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.config import ConfigError, Settings, load_settings
from app.config.pipeline import PlateauLoopConfig, QualityLoopConfig, TrainConfig
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.feedback_loops import (
    DataQuality, ExplorationDecision, Feedback, TrainingDecision, decide_exploration, decide_training,
    explore_settings, training_values,
)
from app.db.replay_db import GameRecord, MoveRecord
from app.games.train.data_quality import data_quality

quality_configs = st.builds(
    lambda low, width, step, floor: QualityLoopConfig(enabled=True, low=low, high=min(1.0, low + width), step=step,
                                                      min_scale=floor),
    st.floats(0.0, 1.0), st.floats(0.0, 0.5), st.floats(0.05, 0.95), st.floats(0.01, 1.0))
plateau_configs = st.builds(
    lambda k, tol, step, top: PlateauLoopConfig(enabled=True, generations=k, tolerance=tol, step=step, max_fraction=top),
    st.integers(2, 6), st.floats(0.0, 0.2), st.floats(0.01, 0.5), st.floats(0.01, 1.0))
scores = st.floats(0.0, 1.0)
losses = st.one_of(st.none(), st.floats(0.01, 5.0))


@settings(max_examples=100, deadline=None)
@given(quality_configs, st.lists(scores, min_size=1, max_size=40))
def test_the_training_scale_stays_within_its_bounds(cfg, observed) -> None:
    decision = TrainingDecision()
    for g, score in enumerate(observed, 1):
        decision = decide_training(decision, score, g, cfg)
        assert cfg.min_scale - 1e-9 <= decision.scale <= 1.0
        values = training_values(decision, TrainConfig(), "lr")
        assert TrainConfig().lr * cfg.min_scale - 1e-12 <= values.get("lr", TrainConfig().lr) <= TrainConfig().lr
        batch = training_values(decision, TrainConfig(), "batch_size").get("batch_size", TrainConfig().batch_size)
        assert TrainConfig().batch_size <= batch <= round(TrainConfig().batch_size / cfg.min_scale) + 1


@settings(max_examples=100, deadline=None)
@given(quality_configs, scores, st.integers(2, 30))
def test_constant_quality_moves_the_scale_one_way_only(cfg, score, n) -> None:
    decision, seen = TrainingDecision(), []
    for g in range(n):
        decision = decide_training(decision, score, g, cfg)
        seen.append(decision.scale)
    steps = np.sign(np.diff([1.0, *seen]))
    assert not (steps > 0).any() or not (steps < 0).any()  # never up and down: no oscillation


def test_quality_has_a_band_where_nothing_moves_and_recovers_to_the_configured_value() -> None:
    cfg = QualityLoopConfig(enabled=True, low=0.5, high=0.6, step=0.5, min_scale=0.25)
    down = decide_training(TrainingDecision(), 0.3, 1, cfg)
    assert down.scale == 0.5 and "< low" in down.reason
    held = decide_training(down, 0.55, 2, cfg)  # inside the band: held, not back up
    assert held.scale == 0.5 and "held" in held.reason
    floor = decide_training(decide_training(held, 0.1, 3, cfg), 0.1, 4, cfg)
    assert floor.scale == 0.25 and "bound" in floor.reason
    up = decide_training(decide_training(floor, 0.9, 5, cfg), 0.9, 6, cfg)
    assert up.scale == 1.0 and training_values(up, TrainConfig(), "lr") == {}
    assert training_values(down, TrainConfig(lr=0.002), "lr") == {"lr": pytest.approx(0.001)}
    assert training_values(down, TrainConfig(batch_size=256), "batch_size") == {"batch_size": 512}


@settings(max_examples=100, deadline=None)
@given(plateau_configs, st.floats(0.0, 0.5), st.lists(st.tuples(losses, st.booleans(), st.one_of(st.none(), scores)),
                                                      min_size=1, max_size=40))
def test_the_noise_stays_within_its_bounds(cfg, base, generations) -> None:
    decision = ExplorationDecision()
    for g, (loss, promoted, vs_best) in enumerate(generations, 1):
        decision = decide_exploration(decision, loss, promoted, vs_best, g, base, cfg)
        assert base - 1e-9 <= decision.fraction <= max(base, cfg.max_fraction) + 1e-9
        assert len(decision.losses) <= cfg.generations


@settings(max_examples=100, deadline=None)
@given(plateau_configs, st.floats(0.0, 0.5), losses, st.booleans(), st.one_of(st.none(), scores), st.integers(2, 40))
def test_constant_generations_move_the_noise_one_way_only(cfg, base, loss, promoted, vs_best, n) -> None:
    decision, seen = ExplorationDecision(), []
    for g in range(n):
        decision = decide_exploration(decision, loss, promoted, vs_best, g, base, cfg)
        seen.append(decision.fraction)
    steps = np.sign(np.diff([base, *seen]))
    assert not (steps > 0).any() or not (steps < 0).any()


def test_k_flat_generations_raise_the_noise_and_an_improvement_lowers_it() -> None:
    cfg = PlateauLoopConfig(enabled=True, generations=3, tolerance=0.02, step=0.1, max_fraction=0.45)
    d = ExplorationDecision()
    for g, loss in enumerate((1.000, 1.005, 0.995), 1):
        d = decide_exploration(d, loss, True, None, g, 0.25, cfg)
    assert d.fraction == pytest.approx(0.35) and "flat" in d.reason and d.losses == ()
    d = decide_exploration(d, 1.0, True, None, 4, 0.25, cfg)  # one flat generation is not K of them
    assert d.fraction == pytest.approx(0.35) and d.losses == (1.0,)
    d = decide_exploration(d, 0.90, True, None, 5, 0.25, cfg)  # clearly below the window's best
    assert d.fraction == pytest.approx(0.25) and "improvement" in d.reason and d.losses == (0.9,)
    d = decide_exploration(d, 0.91, False, None, 6, 0.25, cfg)
    d = decide_exploration(d, 0.905, False, None, 7, 0.25, cfg)  # K flat again, from the new level
    assert d.fraction == pytest.approx(0.35)
    d = decide_exploration(d, None, True, 0.7, 8, 0.25, cfg)  # a promotion that beat the best
    assert d.fraction == pytest.approx(0.25) and "promoted" in d.reason
    for g in range(9, 30):  # a plateau for ever: up to the bound, and there it stays
        d = decide_exploration(d, 2.0, False, None, g, 0.25, cfg)
    assert d.fraction == pytest.approx(0.45)


def test_the_plateau_decision_is_the_lineages_whichever_node_trained_each_generation() -> None:
    """Issue 52: the noise follows the lineage's decided records (each with its loss and its
    games vs the best), not the claiming node's own window: the same records give the same
    decision on every node, equal to deciding generation by generation, whoever trained them."""
    from app.coordination.pipeline.feedback_apply import lineage_history, record_vs_best
    from app.coordination.pipeline.feedback_loops import exploration_of
    from app.coordination.pipeline.generation_log import GenerationRecord

    cfg = PlateauLoopConfig(enabled=True, generations=3, tolerance=0.02, step=0.1, max_fraction=0.45)
    sha = {g: f"{g:x}" * 64 for g in range(1, 7)}

    def record(g: int, loss: float | None, trainer: str, vs_best: tuple[int, int, int] | None = None) -> GenerationRecord:
        results = [["random", 4, 0, 0]] + ([[f"model:{sha[g - 1]}:s8", *vs_best]] if vs_best else [])
        return GenerationRecord(g, sha[g], True, 10 * g, trainer, loss=loss,
                                matches={"player": f"model:{sha[g]}:s8", "results": results})

    records = {1: record(1, 1.000, "n0"), 2: record(2, 1.004, "n1", (1, 0, 3)), 3: record(3, 0.998, "n2", (2, 0, 2))}
    assert record_vs_best(records, 2) == 0.25 and record_vs_best(records, 1) is None
    incremental = ExplorationDecision()
    for d in lineage_history(records):
        incremental = decide_exploration(incremental, d.loss, d.promoted, d.vs_best, d.generation, 0.25, cfg)
    lineage = exploration_of(lineage_history(records), 0.25, cfg)
    assert lineage == incremental and lineage.fraction == pytest.approx(0.35) and lineage.generation == 3
    # any claimant: the same records trained by other nodes decide the same
    swapped = {g: GenerationRecord(**{**r.__dict__, "trained_by": "n9"}) for g, r in records.items()}
    assert exploration_of(lineage_history(swapped), 0.25, cfg) == lineage
    # a generation that beat the best lowers it again; a record without a loss counts nothing
    records[4] = record(4, None, "n0", (4, 0, 0))
    assert exploration_of(lineage_history(records), 0.25, cfg).fraction == pytest.approx(0.25)
    # the loss travels in the decided record (left out when unknown: older records unchanged)
    assert GenerationRecord.from_value(records[3].to_value()).loss == 0.998
    assert "loss" not in records[4].to_json()
    with pytest.raises(ValueError, match="loss"):
        GenerationRecord.from_value({**records[3].to_json(), "loss": "nan"})


def test_self_play_settings_carry_the_decided_noise() -> None:
    base = Settings()
    assert explore_settings(base, None) is base and explore_settings(base, ExplorationDecision()) is base
    moved = explore_settings(base, ExplorationDecision(fraction=0.4))
    assert moved.search.dirichlet_fraction == 0.4 and moved.search.c_puct == base.search.c_puct
    # what the worker pool sends its workers (exclude_unset) carries it too
    assert Settings.model_validate(moved.model_dump(mode="json", exclude_unset=True)).search.dirichlet_fraction == 0.4


def test_decisions_persist_in_the_state_file_and_a_bad_one_is_refused(tmp_path) -> None:
    fb = Feedback(TrainingDecision(0.49, 0.3, 4, "low"), ExplorationDecision(0.35, (1.0, 0.99), 5, "flat"))
    store = ps.PipelineStateStore(tmp_path / "pipeline_state.json")
    store.save(ps.feedback_decided(ps.PipelineState(), fb.to_json()))
    assert Feedback.from_json(store.load().feedback) == fb  # a restarted node resumes both decisions
    assert store.load().feedback == fb.to_json()
    text = (tmp_path / "pipeline_state.json").read_text().replace('"scale": 0.49', '"scale": "x", "bogus": 1')
    (tmp_path / "pipeline_state.json").write_text(text)
    with pytest.raises(ps.PipelineStateError, match="pipeline_state.json"):
        store.load()


def test_settings_are_validated(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("feedback:\n  quality:\n    enabled: true\n    low: 0.7\n    high: 0.6\n")
    with pytest.raises(ConfigError, match="low"):
        load_settings(bad)
    bad.write_text("feedback:\n  plateau:\n    enabled: true\n    max_fraction: 0.1\n")
    with pytest.raises(ConfigError, match="max_fraction"):
        load_settings(bad)
    bad.write_text("workload: lm\nfeedback:\n  plateau:\n    enabled: true\n")
    with pytest.raises(ConfigError, match="feedback"):
        load_settings(bad)
    assert not Settings().feedback.quality.enabled and not Settings().feedback.plateau.enabled


def _game(uid: str, actions: list[int], winner: int | None) -> GameRecord:
    return GameRecord(uid=uid, game="connect4", winner=winner, moves=[MoveRecord(a, [1.0] * 7, 0.0) for a in actions])


def test_data_quality_counts_duplicates_draws_and_entropy() -> None:
    games = [_game("a", [0, 1, 0], 0), _game("b", [0, 1, 0], 1), _game("c", [3, 3], None), _game("d", [2], None)]
    uniform, one_hot = np.full((4, 7), 1 / 7), np.eye(7)[:4]
    q = DataQuality.from_json(data_quality(games, [uniform, one_hot], 7))
    assert q == DataQuality(4, 0.25, 0.5, pytest.approx(0.5))
    assert q.score == pytest.approx((0.75 + 0.5 + 0.5) / 3)
    assert DataQuality.from_json({"games": 1}) is None and DataQuality.from_json(None) is None
