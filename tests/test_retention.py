"""What a node deletes once generations are decided (app/coordination/pipeline/retention.py): the
decision alone here, on real paths; the whole nodes that sweep are the dashboard test (a game
node: a decided run's checkpoint goes, its candidate stays) and the lone LM node test (heads
installed at every rejection go once superseded)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.coordination.pipeline.retention import Lineage, generation_dirs, plan, run_checkpoints
from app.coordination.sync.model_store import installed_models, remove_model

pytestmark = pytest.mark.timeout(30)


def lineage(generation: int, keep_runs=(), keep_models=(), superseded=()) -> Lineage:
    return Lineage(generation, frozenset(keep_runs), frozenset(keep_models), frozenset(superseded))


def test_decided_runs_lose_their_checkpoints_but_the_best_and_the_heads_runs(tmp_path: Path) -> None:
    for g in range(1, 7):
        run = tmp_path / "runs" / f"gen_{g:04d}"
        (run / "rl" / "step_00000030").mkdir(parents=True)
        (run / "candidate").mkdir()
        (run / "checkpoint.pt").write_bytes(b"x")
        (run / "checkpoint_step000010.pt").write_bytes(b"x")
    (tmp_path / "runs" / "join_gen_0002").mkdir()  # not a generation's own run: never touched
    found = run_checkpoints(tmp_path / "runs", ("checkpoint*.pt", "rl", "sft"))
    assert sorted(found) == [1, 2, 3, 4, 5, 6] and len(found[1]) == 3  # no "sft" here, the candidate is none
    todo = plan(lineage(5, keep_runs={2, 4}), found, {}, [])
    runs = sorted({p.parent.name for p in todo.checkpoints})
    assert runs == ["gen_0001", "gen_0003"]  # 5 and 6 are in progress (a restart resumes 5), 2 and 4 kept
    assert all(p.name != "candidate" for p in todo.checkpoints)


def test_the_newest_decided_datasets_stay_and_the_one_in_progress(tmp_path: Path) -> None:
    for g in (1, 2, 3, 4, 5):
        (tmp_path / "datasets" / f"gen_{g:04d}").mkdir(parents=True)
    (tmp_path / "datasets" / ("a" * 64)).mkdir()  # a joiner's fetched copy, by sha256: not by generation
    datasets = generation_dirs(tmp_path / "datasets")
    assert sorted(datasets) == [1, 2, 3, 4, 5]
    assert [p.name for p in plan(lineage(5), {}, datasets, [], keep_datasets=2).datasets] == ["gen_0001", "gen_0002"]
    assert plan(lineage(5), {}, datasets, [], keep_datasets=10).datasets == []
    assert [p.name for p in plan(lineage(3), {}, datasets, [], keep_datasets=0).datasets] == ["gen_0001", "gen_0002"]


def test_only_a_model_known_superseded_and_not_kept_leaves_the_store() -> None:
    installed = ["best", "head", "old_head", "promoted_once", "unknown"]
    todo = plan(lineage(9, keep_models={"best", "head", "promoted_once"},
                        superseded={"head", "old_head", "promoted_once", "never_installed"}), {}, {}, installed)
    assert todo.models == ["old_head"]


def test_the_game_model_store_removes_a_model_whole(tmp_path: Path) -> None:
    """What a sweep asks of the store: weights and sidecar go together, others stay."""
    for sha in ("a" * 64, "b" * 64):
        (tmp_path / f"{sha}.safetensors").write_bytes(b"w" * 100)
        (tmp_path / f"{sha}.json").write_text("{}")
    assert remove_model(tmp_path, "a" * 64) == 102
    assert installed_models(tmp_path) == ["b" * 64] and not (tmp_path / f"{'a' * 64}.json").exists()
    assert remove_model(tmp_path, "a" * 64) == 0

