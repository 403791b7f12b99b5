"""Export: replay DBs -> NPZ dataset, and loading it back with every digest verified."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.games import GameError, get_game
from app.games.train.dataset import DatasetError, dataset_sha256, load_dataset
from app.games.train.export import (
    ExportError, export_dataset, game_samples, holdout_score, is_holdout, outcome_for, select_window,
)
from tests.train_fixtures import make_db

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def two_dbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    """DB a holds games 0..59, DB b holds games 40..99: 20 shared, 100 distinct."""
    base = tmp_path_factory.mktemp("dbs")
    a, b = base / "a.db", base / "b.db"
    records = make_db(a, 60, seed=1)
    make_db(b, 40, seed=2, start=60)  # games 60..99 are only in b
    with ReplayDB(b) as db:
        assert db.add_games(records[40:]) == 20  # games 40..59 are in both
    return a, b, 100


def test_two_dbs_sharing_games_count_each_once(two_dbs, tmp_path):
    a, b, distinct = two_dbs
    result = export_dataset([a, b], tmp_path / "ds", window_games=1000, holdout_fraction=0.2, augment=False)
    counts = result.manifest["counts"]
    assert counts["games"] == distinct
    assert counts["duplicates_dropped"] == 20
    assert counts["train_games"] + counts["holdout_games"] == distinct
    ds = load_dataset(tmp_path / "ds")
    with ReplayDB(a) as da, ReplayDB(b) as dbb:
        union = {g.uid: len(g.moves) for g in da.games() + dbb.games()}
    assert len(union) == distinct
    assert len(ds.train) + len(ds.holdout) == sum(union.values())
    assert ds.sha256 == result.dataset_sha256 == dataset_sha256(tmp_path / "ds")
    assert [i["games_total"] for i in result.manifest["inputs"]] == [60, 60]


def test_holdout_identical_across_exports(two_dbs, tmp_path):
    a, b, _ = two_dbs
    first = export_dataset([a, b], tmp_path / "one", window_games=1000, holdout_fraction=0.2)
    second = export_dataset([b, a], tmp_path / "two", window_games=1000, holdout_fraction=0.2)
    assert first.manifest["holdout_uids_sha256"] == second.manifest["holdout_uids_sha256"]
    assert first.manifest["counts"]["holdout_games"] > 0
    h1, h2 = load_dataset(tmp_path / "one").holdout, load_dataset(tmp_path / "two").holdout
    np.testing.assert_array_equal(h1.planes, h2.planes)
    np.testing.assert_array_equal(h1.policy, h2.policy)
    np.testing.assert_array_equal(h1.value, h2.value)


def test_window_takes_newest_and_augmentation_doubles_train(two_dbs, tmp_path):
    a, b, _ = two_dbs
    plain = export_dataset([a, b], tmp_path / "p", window_games=30, holdout_fraction=0.0, augment=False)
    aug = export_dataset([a, b], tmp_path / "q", window_games=30, holdout_fraction=0.0, augment=True)
    assert plain.manifest["counts"]["games"] == 30
    assert aug.manifest["counts"]["train_samples"] == 2 * plain.manifest["counts"]["train_samples"]
    with ReplayDB(b) as db:
        newest = sorted(db.games(), key=lambda g: g.finished_at)[-30:]
    assert plain.manifest["counts"]["train_samples"] == sum(len(g.moves) for g in newest)
    ds = load_dataset(tmp_path / "q")
    # each mirrored sample follows its original: planes and policy flipped left-right
    np.testing.assert_array_equal(ds.train.planes[1], ds.train.planes[0][..., ::-1])
    np.testing.assert_array_equal(ds.train.policy[1], ds.train.policy[0][::-1])


def test_targets_are_visits_and_outcome_from_side_to_move():
    game = get_game("connect4")
    # first player wins with a vertical four in column 1: moves 1,2,1,2,1,2,1
    actions = [0, 1, 0, 1, 0, 1, 0]
    visits = [[0.0] * 7 for _ in actions]
    for v, a in zip(visits, actions):
        v[a] = 2.0  # unnormalised on purpose
    record = GameRecord("w", "connect4", [MoveRecord(a, v, 0.0) for a, v in zip(actions, visits)], winner=0)
    samples = game_samples(game, record, augment=False)
    planes, policy, value = samples.planes, samples.policy, samples.value.tolist()
    assert value == [1.0, -1.0, 1.0, -1.0, 1.0, -1.0, 1.0]
    assert np.allclose(policy[2], np.eye(7)[0])
    np.testing.assert_array_equal(planes[2], game.parse("12").planes())
    bad = GameRecord("x", "connect4", record.moves, winner=1)
    with pytest.raises(GameError, match="recorded winner 1 but the moves end with winner 0"):
        game_samples(game, bad, augment=False)
    # with a length discount a seven-move win is worth 1 - 0.5 * 7 / 42 to every position of it
    shrunk = game_samples(game, record, augment=False, length_discount=0.5).value
    assert np.allclose(shrunk, np.array(value) * (1 - 0.5 * 7 / 42))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=1, max_size=40), st.floats(0.0, 1.0))
def test_holdout_is_a_pure_function_of_uid(uid, fraction):
    score = holdout_score(uid)
    assert 0.0 <= score < 1.0
    assert is_holdout(uid, fraction) == (score < fraction)
    assert holdout_score(uid) == score


def test_holdout_fraction_is_about_right():
    uids = [f"game-{i}" for i in range(20000)]
    share = sum(is_holdout(u, 0.05) for u in uids) / len(uids)
    assert 0.04 < share < 0.06


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 50)), max_size=25), min_size=1, max_size=4),
    st.integers(1, 40),
)
def test_select_window_properties(inputs, window):
    per_input = [[GameRecord(f"u{u}", "connect4", [], None, finished_at=float(u)) for u, _ in db] for db in inputs]
    selected, duplicates = select_window(per_input, window)
    distinct = {r.uid for db in per_input for r in db}
    total = sum(len(db) for db in per_input)
    assert len({r.uid for r in selected}) == len(selected) == min(window, len(distinct))
    assert duplicates == total - len(distinct)
    keys = [(r.finished_at, r.uid) for r in selected]
    assert keys == sorted(keys)
    rest = [(float(u[1:]), u) for u in distinct - {r.uid for r in selected}]
    assert not rest or not keys or max(rest) < keys[0]


def test_outcome_for():
    assert outcome_for(None, 0) == 0.0
    assert outcome_for(1, 1) == 1.0
    assert outcome_for(1, 0) == -1.0


def test_missing_db_is_named_and_nothing_written(two_dbs, tmp_path):
    a, _, _ = two_dbs
    missing = tmp_path / "nope.db"
    with pytest.raises(ExportError, match="nope.db"):
        export_dataset([a, missing], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert list(tmp_path.iterdir()) == []


def test_corrupt_db_is_named_and_nothing_written(two_dbs, tmp_path):
    a, _, _ = two_dbs
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(ExportError, match="bad.db"):
        export_dataset([a, bad], tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.db"]


def test_locked_db_is_named_and_nothing_written(tmp_path):
    db = tmp_path / "locked.db"
    make_db(db, 3)
    holder = sqlite3.connect(db)
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        with pytest.raises(ExportError, match="locked.db.*locked"):
            export_dataset([db], tmp_path / "out", lock_timeout_s=0.2)
    finally:
        holder.close()
    assert not (tmp_path / "out").exists()


def test_existing_output_needs_overwrite(two_dbs, tmp_path):
    a, _, _ = two_dbs
    first = export_dataset([a], tmp_path / "ds", window_games=10)
    with pytest.raises(ExportError, match="already exists"):
        export_dataset([a], tmp_path / "ds", window_games=10)
    second = export_dataset([a], tmp_path / "ds", window_games=20, overwrite=True)
    assert second.manifest["counts"]["games"] == 20 != first.manifest["counts"]["games"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]
    assert load_dataset(tmp_path / "ds").sha256 == second.dataset_sha256


def test_truncated_npz_is_refused_by_name(two_dbs, tmp_path):
    a, _, _ = two_dbs
    export_dataset([a], tmp_path / "ds", window_games=20)
    train = tmp_path / "ds" / "train.npz"
    data = train.read_bytes()
    train.write_bytes(data[: len(data) // 2])
    with pytest.raises(DatasetError, match=str(train)):
        load_dataset(tmp_path / "ds")
    # even with a manifest rewritten to match, the NPZ reader refuses it by name
    manifest_path = tmp_path / "ds" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    import hashlib
    manifest["files"]["train.npz"] = {"sha256": hashlib.sha256(train.read_bytes()).hexdigest(),
                                      "bytes": train.stat().st_size}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DatasetError, match=f"{train}.*(truncated|corrupt)"):
        load_dataset(tmp_path / "ds")


def test_expectations_checked(two_dbs, tmp_path):
    a, _, _ = two_dbs
    result = export_dataset([a], tmp_path / "ds", window_games=5)
    with pytest.raises(DatasetError, match="expected"):
        load_dataset(tmp_path / "ds", expect_sha256="0" * 64)
    with pytest.raises(DatasetError, match="chess"):
        load_dataset(tmp_path / "ds", expect_game="chess")
    assert load_dataset(tmp_path / "ds", expect_sha256=result.dataset_sha256, expect_game="connect4")
    with pytest.raises(DatasetError, match="manifest not found"):
        load_dataset(tmp_path / "nothing")


def test_cli_exports_and_reports_bad_input(two_dbs, tmp_path):
    a, b, _ = two_dbs
    script = ROOT / "scripts" / "export_replay_dataset.py"
    ok = subprocess.run(
        [sys.executable, str(script), "--db", str(a), "--db", str(b), "--out", str(tmp_path / "ds"),
         "--window", "50", "--no-augment"],
        capture_output=True, text=True, timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["counts"]["games"] == 50
    assert report["dataset_sha256"] == dataset_sha256(tmp_path / "ds")
    bad = subprocess.run(
        [sys.executable, str(script), "--db", str(tmp_path / "missing.db"), "--out", str(tmp_path / "ds2")],
        capture_output=True, text=True, timeout=60,
    )
    assert bad.returncode == 2
    assert "missing.db" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / "ds2").exists()
