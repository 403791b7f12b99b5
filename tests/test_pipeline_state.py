"""The loop's persisted stage machine: every transition, and what a restart reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from app.coordination.pipeline import state as ps
from app.coordination.pipeline.state import PipelineState, PipelineStateError, PipelineStateStore, Stage

SHA = "a" * 64

STEPS = {
    "export": lambda s: ps.exported(s, "d", SHA, s.export_mark + 10),
    "start": lambda s: ps.training_started(s, "run"),
    "trained": lambda s: ps.trained(s, "c.safetensors", SHA),
    "fail": ps.training_failed,
    "evaluated": lambda s: ps.evaluated(s, {"random": 1.0}),
    "promote": lambda s: ps.decided(s, True),
    "reject": lambda s: ps.decided(s, False),
}


def test_one_generation_end_to_end(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the node's default data dir is relative (./data): so are its paths
    store = PipelineStateStore(Path("state.json"))
    state = store.load()
    assert state == PipelineState()
    assert not ps.should_export(state, 9, 10) and ps.should_export(state, 10, 10)
    for step in ("export", "start", "trained", "evaluated", "promote"):
        state = STEPS[step](state)
        store.save(state)
        assert store.load() == state
    assert state.stage is Stage.COLLECTING and state.generation == 2
    assert state.best_sha256 == SHA and state.best_generation == 1 and state.promoted == 1
    assert not ps.should_export(state, 19, 10) and ps.should_export(state, 20, 10)


def test_restart_mid_training_resumes_the_same_generation() -> None:
    state = STEPS["start"](STEPS["export"](PipelineState()))
    again = ps.training_started(state, "run")  # what a restarted train daemon does
    assert again.generation == state.generation == 1 and again.stage is Stage.TRAINING


def test_a_kept_head_is_the_next_parent_and_a_new_best_clears_it() -> None:
    other = "b" * 64
    best = ps.switched_best(PipelineState(), other, "models/b", 1)
    evaluated = STEPS["evaluated"](STEPS["trained"](STEPS["start"](STEPS["export"](best))))
    assert ps.parent(evaluated) == ("models/b", other)
    kept = ps.decided(evaluated, False, head_path="c.safetensors")
    assert ps.parent(kept) == ("c.safetensors", SHA) and kept.head_generation == 1 and kept.rejected == 1
    assert ps.parent(ps.decided(evaluated, False)) == ("models/b", other)  # regressed: from the best
    assert ps.parent(ps.switched_best(kept, other, "models/b", 1)) == ("c.safetensors", SHA)  # the same best
    assert ps.parent(ps.switched_best(kept, "d" * 64, "models/d", 2)) == ("models/d", "d" * 64)
    exported = STEPS["export"](kept)
    assert ps.parent(ps.head_resolved(exported, other, "x", 1)) == ("models/b", other)  # the head is the best
    assert ps.parent(ps.head_resolved(exported, None, None, 0)) == ("models/b", other)


def test_wrong_stage_is_refused() -> None:
    with pytest.raises(PipelineStateError, match="generation 1 is collecting, not training"):
        ps.trained(PipelineState(), "c", SHA)
    with pytest.raises(PipelineStateError, match="generation 1 is collecting, not evaluated"):
        ps.decided(PipelineState(), True)


def test_unreadable_state_file_is_named(tmp_path) -> None:
    path = tmp_path / "state.json"
    path.write_text("{not json")
    with pytest.raises(PipelineStateError, match=str(path)):
        PipelineStateStore(path).load()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(sorted(STEPS)), max_size=40))
def test_generations_only_move_forward(steps: list[str]) -> None:
    state = PipelineState()
    for step in steps:
        before = state
        try:
            state = STEPS[step](state)
        except PipelineStateError:
            assert state == before
            continue
        assert state.generation >= before.generation
        assert state.decided == state.generation - 1
        assert state.export_mark >= before.export_mark
        if state.generation > before.generation:
            assert step in ("promote", "reject") and state.stage is Stage.COLLECTING


def test_the_idle_core_plays_only_while_a_lone_node_collects_with_its_export_not_due() -> None:
    collecting = PipelineState(export_mark=100)
    def workers(state: PipelineState, newest: int, threshold: int | None = 400, clustered: bool = False) -> int:
        return ps.selfplay_workers(state, newest, threshold, workers=1, collect_workers=2, clustered=clustered)

    assert workers(collecting, 100 + 399) == 2
    assert workers(collecting, 100 + 400) == 1, "the export is due: the trainer needs the core next"
    assert workers(ps.exported(collecting, "d", "sha", 500), 520) == 1
    assert workers(ps.training_started(ps.exported(collecting, "d", "sha", 500), "r"), 520) == 1
    assert workers(collecting, 150, threshold=None) == 1, "no export daemon here: nothing known of its pace"
    assert workers(collecting, 150, clustered=True) == 1, "a cluster node may train or judge for others"
    assert ps.selfplay_workers(collecting, 150, 400, workers=3, collect_workers=2, clustered=False) == 3


def test_paths_are_stored_relative_and_an_old_absolute_file_is_found_again(tmp_path) -> None:
    """A data dir moves (a restore, another disk): its state names files inside it relatively;
    one written with absolute paths elsewhere is read with them found again under the new dir."""
    data = tmp_path / "data"
    (data / "models").mkdir(parents=True)
    (data / "models" / "m.safetensors").write_bytes(b"x")
    store = PipelineStateStore(data / "pipeline_state.json")
    store.save(ps.switched_best(PipelineState(), SHA, str(data / "models" / "m.safetensors"), 1))
    assert json.loads(store.path.read_text())["best_path"] == "models/m.safetensors"
    assert store.load().best_path == str(data / "models" / "m.safetensors")
    store.path.write_text(store.path.read_text().replace('"models/m.safetensors"', '"/gone/data/models/m.safetensors"'))
    assert store.load().best_path == str(data / "models" / "m.safetensors")
