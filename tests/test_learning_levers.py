"""The learning levers of issue 15, each behind a config flag (the defaults are the measured ones):
playout-cap randomisation (per-tree search budgets and noise, fast moves left out of the data),
random openings (played, recorded, never sampled), value targets mixing the result with the
search's value, and a training window that grows with the data."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from app.games.search.evaluators import UniformEvaluator
from app.games.search.mcts import SearchForest
from app.config import Settings
from app.config.pipeline import ExportConfig, SearchConfig, SelfplayConfig
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.games import GameError, get_game
from app.games.train.dataset import load_dataset
from app.games.train.export import ExportError, WindowGrowth, export_dataset, game_samples, value_target
from app.games.train.selfplay import play_games, search_budgets
from app.games.train.selfplay_games import random_opening

GAME = get_game("connect4")


def searched_counts(budgets, noise, seed: int = 3) -> list[np.ndarray]:
    forest = SearchForest(GAME)
    slots = [forest.add(GAME.initial_state()) for _ in budgets]
    results = forest.search(slots, UniformEvaluator(GAME), list(budgets), SearchConfig(),
                            np.random.default_rng(seed), add_noise=list(noise))
    return [r.counts for r in results]


# ---- per-tree budgets and noise in the batched search -----------------------------------------


def test_each_tree_gets_its_own_budget_and_noise_only_where_asked() -> None:
    counts = searched_counts([0, 5, 20], [False, False, False])
    assert [int(c.sum()) for c in counts] == [0, 5, 20]
    noisy, quiet = searched_counts([16, 16], [True, False])
    # the same tree alone, with the same random stream, searches the same: flags act per tree
    assert np.array_equal(noisy, searched_counts([16], [True])[0])
    assert np.array_equal(quiet, searched_counts([16], [False])[0])
    assert not np.array_equal(noisy, quiet)  # the noise changed where the visits went
    # the scalar forms are the old API and mean "the same for every tree"
    forest = SearchForest(GAME)
    slots = [forest.add(GAME.initial_state()) for _ in range(2)]
    scalar = forest.search(slots, UniformEvaluator(GAME), 16, SearchConfig(), np.random.default_rng(3), add_noise=True)
    assert all(np.array_equal(r.counts, searched_counts([16, 16], [True, True])[i]) for i, r in enumerate(scalar))
    with pytest.raises(ValueError, match="2 budgets and 2 noise flags for 3 trees"):
        forest.search([forest.add(GAME.initial_state()) for _ in range(3)], UniformEvaluator(GAME), [1, 2],
                      SearchConfig(), np.random.default_rng(0), add_noise=[True, False])
    with pytest.raises(ValueError, match="simulations must be >= 0"):
        searched_counts([4, -1], [False, False])


def test_playout_cap_budgets_and_the_off_switch_draws_nothing() -> None:
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    assert search_budgets(4, 64, 1.0, 8, rng) == ([64] * 4, [True] * 4)
    assert rng.bit_generator.state == before  # off: self-play's random stream is untouched
    budgets, full = search_budgets(4000, 64, 0.25, 8, rng)
    assert set(budgets) == {64, 8} and all((b == 64) == f for b, f in zip(budgets, full))
    assert 0.22 < sum(full) / 4000 < 0.28
    assert set(search_budgets(10, 4, 0.5, 8, rng)[0]) <= {4}  # a fast search is never the longer one


def test_selfplay_marks_fast_moves_and_is_unchanged_when_off() -> None:
    on = Settings(selfplay=SelfplayConfig(concurrent_games=8, full_search_prob=0.3, fast_simulations=2))
    records = list(play_games(8, UniformEvaluator(GAME), on, 8, np.random.default_rng(1)))
    fast = [p for r in records for p in r.search["fast_plies"]]
    plies = sum(len(r.moves) - r.search["opening_plies"] for r in records)  # the searched moves
    assert all(0 <= p < len(r.moves) for r in records for p in r.search["fast_plies"])
    assert 0.5 < len(fast) / plies < 0.9  # about 70 % fast at full_search_prob 0.3
    assert records[0].search["full_search_prob"] == 0.3 and records[0].search["fast_simulations"] == 2
    off = list(play_games(4, UniformEvaluator(GAME), Settings(), 8, np.random.default_rng(1)))
    assert all("fast_plies" not in r.search and "full_search_prob" not in r.search for r in off)
    assert all("opening_plies" in r.search for r in off)  # random openings are on by default


def test_random_openings_are_legal_bounded_and_off_by_default() -> None:
    rng = np.random.default_rng(7)
    before = rng.bit_generator.state
    moves, reached = random_opening(GAME, 0, rng)
    assert moves == [] and reached == GAME.initial_state() and rng.bit_generator.state == before  # off: nothing drawn
    lengths = []
    for _ in range(300):
        moves, reached = random_opening(GAME, 12, rng)
        state = GAME.initial_state()
        for move in moves:
            state = state.play(move)  # raises on an illegal move
        assert not state.is_terminal and state == reached
        lengths.append(len(moves))
    assert min(lengths) == 0 and max(lengths) == 12  # uniform over 0..12: both ends come up in 300 draws


def test_selfplay_records_its_random_opening_and_export_leaves_it_out() -> None:
    on = Settings(selfplay=SelfplayConfig(concurrent_games=8, random_opening_plies=10))
    records = list(play_games(16, UniformEvaluator(GAME), on, 8, np.random.default_rng(2)))
    openings = [r.search["opening_plies"] for r in records]
    assert all(0 <= k <= 10 for k in openings) and len(set(openings)) > 3
    for record in records:
        k = record.search["opening_plies"]
        assert all(sum(m.visits) == pytest.approx(1.0) and m.visits[m.action] == 1.0 for m in record.moves[:k])
        samples = game_samples(GAME, record, augment=False)
        assert len(samples) == len(record.moves) - k  # every searched move, none of the opening
    off = Settings(selfplay=SelfplayConfig(random_opening_plies=0))
    assert all("opening_plies" not in r.search for r in play_games(4, UniformEvaluator(GAME), off, 8, np.random.default_rng(1)))
    bad = GameRecord(uid="b", game=GAME.name, moves=records[0].moves, winner=records[0].winner,
                     search={**records[0].search, "opening_plies": len(records[0].moves) + 1})
    with pytest.raises(GameError, match="opening_plies"):
        game_samples(GAME, bad, augment=False)
    with pytest.raises(ValueError):
        SelfplayConfig(random_opening_plies=-1)


# ---- what export makes of it ------------------------------------------------------------------


def a_game(uid: str = "g1", fast: list[int] | None = None, finished_at: float = 1.0) -> GameRecord:
    """Column 1 four times for the first player, column 2 three times for the second: 7 plies,
    first player wins; root values 0.1 * ply from each side to move's view."""
    moves = [0, 1, 0, 1, 0, 1, 0]
    visits = np.full(GAME.num_actions, 1 / GAME.num_actions).tolist()
    search = {"simulations": 8} if fast is None else {"simulations": 8, "full_search_prob": 0.5, "fast_plies": fast}
    return GameRecord(uid=uid, game=GAME.name, moves=[MoveRecord(a, visits, 0.1 * i) for i, a in enumerate(moves)],
                      winner=0, search=search, finished_at=finished_at)


def test_fast_moves_are_played_but_not_sampled_and_values_mix() -> None:
    plain = game_samples(GAME, a_game(), augment=False)
    planes, values = plain.planes, plain.value.tolist()
    assert len(planes) == 7 and values == [1.0, -1.0] * 3 + [1.0]  # the default: the result only
    planes_fast = game_samples(GAME, a_game(fast=[1, 2, 5]), augment=True).planes
    assert len(planes_fast) == 2 * 4  # plies 0, 3, 4, 6, mirrored
    kept = [0, 3, 4, 6]
    assert all(np.array_equal(planes_fast[2 * i], planes[p]) for i, p in enumerate(kept))  # the right positions
    mixed = game_samples(GAME, a_game(), augment=False, value_mix=0.25).value.tolist()
    assert mixed == pytest.approx([0.75 * v + 0.25 * 0.1 * i for i, v in enumerate(values)])
    assert value_target(-1.0, 0.5, 1.0) == 0.5 and value_target(-1.0, 0.5, 0.0) == -1.0


def test_export_applies_the_value_mix_and_records_it(tmp_path: Path) -> None:
    with ReplayDB(tmp_path / "games.db") as db:
        db.add_game(a_game(fast=[1, 2, 5]))
    plain = export_dataset([tmp_path / "games.db"], tmp_path / "plain", holdout_fraction=0.0, augment=False)
    mixed = export_dataset([tmp_path / "games.db"], tmp_path / "mixed", holdout_fraction=0.0, augment=False,
                           value_target_mix=0.5)
    assert plain.manifest["value_target_mix"] == 0.0 and mixed.manifest["value_target_mix"] == 0.5
    assert plain.manifest["counts"]["train_samples"] == 4
    plain_values = load_dataset(tmp_path / "plain").train.value
    mixed_values = load_dataset(tmp_path / "mixed").train.value
    roots = np.array([0.0, 0.3, 0.4, 0.6])
    assert plain_values == pytest.approx([1.0, -1.0, 1.0, 1.0])
    assert mixed_values == pytest.approx(0.5 * plain_values + 0.5 * roots)
    with pytest.raises(ExportError, match="value_target_mix must be in"):
        export_dataset([tmp_path / "games.db"], tmp_path / "bad", value_target_mix=1.5)


def test_window_grows_with_the_data_up_to_its_cap(tmp_path: Path) -> None:
    growth = WindowGrowth(100, alpha=0.75, beta=0.4)
    assert growth.size(60, cap=1000) == 60 and growth.size(100, cap=1000) == 100  # everything, early on
    expected = 100 * (1 + 0.4 * (10 ** 0.75 - 1) / 0.75)
    assert growth.size(1000, cap=1000) == int(expected) and 300 < expected < 400
    assert growth.size(10**6, cap=5000) == 5000
    sizes = [growth.size(n, cap=10**9) for n in range(100, 100000, 997)]
    assert sizes == sorted(sizes)  # never shrinks as games arrive
    assert WindowGrowth.from_config(0, 0.75, 0.4) is None  # the default: a fixed window
    with pytest.raises(ExportError, match="window growth needs"):
        WindowGrowth(100, alpha=1.5).size(10, 10)
    with ReplayDB(tmp_path / "games.db") as db:
        for i in range(30):
            db.add_game(a_game(uid=f"g{i:02d}", finished_at=float(i)))
    result = export_dataset([tmp_path / "games.db"], tmp_path / "ds", window_games=25, holdout_fraction=0.0,
                            window_growth=WindowGrowth(10))
    used = int(10 * (1 + 0.4 * (3 ** 0.75 - 1) / 0.75))
    assert result.manifest["window_games_used"] == used == result.manifest["counts"]["games"] == 16
    fixed = export_dataset([tmp_path / "games.db"], tmp_path / "fixed", window_games=25, holdout_fraction=0.0)
    assert fixed.manifest["window_games_used"] == fixed.manifest["counts"]["games"] == 25


def test_the_measured_levers_are_the_defaults_and_bad_values_are_refused() -> None:
    """The 2-core defaults (docs/BENCHMARKS.md): value mixing, a growing window and random openings
    of up to 10 plies on, playout-cap randomisation off (measured: no gain per CPU minute)."""
    s = Settings()
    assert s.selfplay.full_search_prob == 1.0 and s.export.value_target_mix == 0.25
    assert s.selfplay.random_opening_plies == 10
    assert s.export.window_base_games == 2000 and s.train.max_steps == 400
    for bad in ({"full_search_prob": 0.0}, {"full_search_prob": 1.2}, {"fast_simulations": 0}):
        with pytest.raises(ValueError):
            SelfplayConfig(**bad)
    for bad in ({"value_target_mix": -0.1}, {"window_base_games": -1}, {"window_alpha": 0.0}):
        with pytest.raises(ValueError):
            ExportConfig(**bad)
    assert math.isclose(ExportConfig(window_base_games=500).window_alpha, 0.75)


@pytest.mark.timeout(120)
def test_the_export_cli_takes_the_levers_from_the_config(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    with ReplayDB(tmp_path / "games.db") as db:
        for i in range(30):
            db.add_game(a_game(uid=f"g{i:02d}", finished_at=float(i)))
    config = tmp_path / "node.yaml"
    config.write_text("export: {window_games: 25, holdout_fraction: 0.0, value_target_mix: 0.5, window_base_games: 10}\n")
    proc = subprocess.run([sys.executable, "scripts/export_replay_dataset.py", "--db", str(tmp_path / "games.db"),
                           "--out", str(tmp_path / "ds"), "--config", str(config)],
                          cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "ds" / "manifest.json").read_text())
    assert manifest["window_games_used"] == manifest["counts"]["games"] == 16
    assert manifest["value_target_mix"] == 0.5
