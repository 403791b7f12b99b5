"""The fixed anchor every gauntlet plays by default: which baselines, how many games each, the
shard plan cut per baseline, the anchor's name, and a config that names no fixed player refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import ConfigError, load_settings
from app.coordination.pipeline.gauntlet_plan import GauntletRequest, shards_of
from app.db.registry import ModelRegistry
from app.games.train.gauntlet import format_table, run_gauntlet
from app.games.train.gauntlet_baselines import Baseline, anchor_player, planned_baselines


def test_the_anchor_is_played_by_default_with_its_own_small_count() -> None:
    settings = load_settings(None)
    assert planned_baselines([], settings) == [Baseline("anchor", "heuristic:2", 4)]  # no gate: still rated
    assert planned_baselines(["random"], settings, games=10) == [
        Baseline("random", "random", 10), Baseline("anchor", "heuristic:2", 4)]
    assert anchor_player(settings) == "heuristic-d2"


def test_an_anchor_that_a_gate_plays_already_is_one_match_of_the_larger_count() -> None:
    settings = load_settings(None, gauntlet={"games_vs_baseline": 2, "games_vs_anchor": 6})
    assert planned_baselines(["random", "heuristic"], settings) == [
        Baseline("random", "random", 2), Baseline("heuristic", "heuristic:2", 6)]
    deeper = load_settings(None, gauntlet={"anchor": "heuristic:3"})  # another player than the gate's
    assert [b.kind for b in planned_baselines(["heuristic"], deeper)] == ["heuristic", "anchor"]
    assert anchor_player(deeper) == "heuristic-d3"


def test_the_anchor_can_be_turned_off_and_elo_falls_back_to_random() -> None:
    for off in ({"anchor": None}, {"games_vs_anchor": 0}):
        assert planned_baselines(["random"], load_settings(None, gauntlet=off)) == [Baseline("random", "random", 40)]
    assert anchor_player(load_settings(None, gauntlet={"anchor": None})) == "random"
    assert anchor_player(load_settings(None, gauntlet={"anchor": "rollout:50"})) == "rollout-s50"


@pytest.mark.parametrize("bad", ["model.safetensors", "heuristic:0", "grandmaster", "rollout:x"])
def test_an_anchor_that_is_not_a_fixed_player_is_refused(bad: str) -> None:
    with pytest.raises(ConfigError, match="anchor"):
        load_settings(None, gauntlet={"anchor": bad})


def test_the_shard_plan_cuts_each_baseline_at_its_own_count() -> None:
    settings = load_settings(None, gauntlet={"games_vs_baseline": 8})
    baselines = planned_baselines(["random"], settings)
    request = GauntletRequest(3, "ab" * 32, "n0", 32, 2, {b.kind: (b.spec, b.games) for b in baselines})
    again = GauntletRequest.from_json(request.to_json())  # as gossip carries it
    shards = shards_of(again)
    assert [(s.kind, s.games) for s in shards] == [("random", 2)] * 4 + [("anchor", 2)] * 2
    assert {s.baseline for s in shards if s.kind == "anchor"} == {"heuristic:2"}
    assert shards[-1].item_key == f"generation-3-{'ab' * 6}-anchor-1"


def test_a_lone_gauntlet_plays_the_anchor_and_rates_against_it(tmp_path: Path) -> None:
    settings = load_settings(None, gauntlet={"opening_plies_min": 2, "opening_plies_max": 4, "heuristic_depth": 1,
                                             "anchor": "heuristic:1", "games_vs_anchor": 2})
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        report = run_gauntlet("heuristic:2", planned_baselines(["random"], settings, games=4), None, settings,
                              registry, workers=1, seed=1)
    assert [(r.kind, r.opponent, r.games) for r in report.results] == [
        ("random", "random", 4), ("anchor", "heuristic-d1", 2)]
    assert report.anchor == "heuristic-d1"
    ratings = {r.player: r for r in report.ratings}
    assert ratings["heuristic-d1"].elo == 0.0 and ratings["random"].elo < 0  # random is rated against it
    assert "heuristic-d1 = 0" in format_table(report)
