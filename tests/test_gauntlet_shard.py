"""Gauntlet shards: a shard played for real is recorded and published compactly, a copy that
does not belong is refused, and merging counts every game once, however often it is seen."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import load_settings
from app.db.registry import ModelRegistry
from app.games.train.gauntlet import OpponentResult
from app.games.train.gauntlet_baselines import baseline_text
from app.games.train.gauntlet_shard import ShardGame, ShardResult, merge_shards, play_shard, shard_refusal

pytestmark = pytest.mark.timeout(60)
ARCH = Architecture(8, 1, (3, 6, 7), 7)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("cand") / "cand.safetensors"
    meta = save_model(new_model(ARCH, seed=1), ModelMeta(ARCH, "connect4", generation=1), path)
    return path, str(meta.sha256)


def settings():
    return load_settings(None, gauntlet={"opening_plies_min": 2, "opening_plies_max": 4, "net_simulations": 2})


def game(uid: str, winner: int | None, cand_first: bool = True) -> ShardGame:
    p0, p1 = ("cand", "random") if cand_first else ("random", "cand")
    return ShardGame(uid, p0, p1, winner, "4455", 2)


def shard(shard_id: str, games: list[ShardGame], sha: str = "a" * 64) -> ShardResult:
    tally = OpponentResult("random", "random")
    for g in games:
        for score in g.pair_scores("cand"):
            tally.add(score)
    return ShardResult(shard_id, sha, "random", tally.wins, tally.draws, tally.losses, tuple(games), "n2")


def test_a_played_shard_is_recorded_and_published_with_colours_alternating(tmp_path: Path, model) -> None:
    path, sha = model
    result = play_shard(path, "random", 4, seed=7, shard_id="gauntlet:generation-1-random-0",
                        settings=settings(), registry_db=tmp_path / "registry.db", net_simulations=2, played_by="n2")
    assert result.candidate_sha256 == sha and result.opponent == "random" and result.played_by == "n2"
    assert result.wins + result.draws + result.losses == len(result.games) == 4
    cand = f"model:{sha}:s2"
    assert [g.player0 == cand for g in result.games] == [True, False, True, False]
    assert shard_refusal(result, cand, sha, "random", 4) is None
    with ModelRegistry(tmp_path / "registry.db") as registry:
        stored = registry.match_games("gauntlet:generation-1-random-0")
    assert sorted(g.uid for g in stored) == [g.uid for g in result.games]
    again = ShardResult.from_json(result.to_json())
    assert again == result
    # the seed picks the openings: the same shard replays the same openings, another seed others
    same = play_shard(path, "random", 4, 7, "x", settings(), tmp_path / "r2.db", 2)
    other = play_shard(path, "random", 4, 8, "y", settings(), tmp_path / "r3.db", 2)
    opening = lambda r: [g.moves[: g.opening_plies] for g in r.games]  # noqa: E731
    assert opening(same) == opening(result) and opening(other) != opening(result)


def test_a_copy_that_does_not_belong_is_refused() -> None:
    good = shard("s1", [game("s1#0", 0), game("s1#1", 0, cand_first=False)])
    assert shard_refusal(good, "cand", "a" * 64, "random", 2) is None
    assert "candidate" in shard_refusal(good, "cand", "b" * 64, "random", 2)
    assert "against" in shard_refusal(good, "cand", "a" * 64, "heuristic-d2", 2)
    assert "games" in shard_refusal(good, "cand", "a" * 64, "random", 1)
    assert "tally" in shard_refusal(replace(good, wins=2, losses=0), "cand", "a" * 64, "random", 2)
    assert "uid" in shard_refusal(shard("s1", [game("s9#0", 0)]), "cand", "a" * 64, "random", 2)
    stranger = ShardResult("s1", "a" * 64, "random", 0, 0, 1, (ShardGame("s1#0", "x", "random", 1, "44"),))
    assert "vs" in shard_refusal(stranger, "cand", "a" * 64, "random", 2)
    with pytest.raises(ValueError, match="winner 2 is not 0, 1 or null"):
        ShardGame.from_json({"uid": "u", "p0": "a", "p1": "b", "w": 2, "m": ""})


def test_merging_counts_each_shard_once_even_if_seen_twice() -> None:
    s0 = shard("r0", [game("r0#0", 0), game("r0#1", 0, cand_first=False)])  # a win, a loss
    s1 = shard("r1", [game("r1#0", None), game("r1#1", 1, cand_first=False)])  # a draw, a win
    h0 = ShardResult("h0", "a" * 64, "heuristic-d2", 0, 0, 2,
                     (ShardGame("h0#0", "cand", "heuristic-d2", 1, "44", 2),
                      ShardGame("h0#1", "heuristic-d2", "cand", 0, "44", 2)))
    best = OpponentResult("model:b", "best", 5, 1, 2, stopped="sprt")
    merged = merge_shards("cand", [("random", "random"), ("heuristic", "heuristic-d2")],
                          [("random", s0), ("random", s1), ("random", s0), ("heuristic", h0), ("heuristic", h0)],
                          best)
    random_, heuristic, best_out = merged.results
    assert (random_.kind, random_.wins, random_.draws, random_.losses) == ("random", 2, 1, 1)
    assert (heuristic.kind, heuristic.opponent, heuristic.losses, heuristic.games) == ("heuristic", "heuristic-d2", 2, 2)
    assert best_out is best
    assert sorted(g.uid for g in merged.games) == ["h0#0", "h0#1", "r0#0", "r0#1", "r1#0", "r1#1"]


def test_three_seat_games_travel_with_their_seats_and_count_by_seat_pairs(tmp_path: Path) -> None:
    # an opponent's seat won: the candidate lost to it and drew the other loser; then it won
    lost = ShardGame("t#0", "cand", "random", 1, "a1", 0, (("random", -0.5), ("random", 1.0), ("cand", -0.5)))
    won = ShardGame("t#1", "cand", "random", 0, "a1", 0, (("cand", 1.0), ("random", -0.5), ("random", -0.5)))
    assert lost.pair_scores("cand") == [0.5, 0.0] and won.pair_scores("cand") == [1.0, 1.0]
    assert ShardGame.from_json(lost.to_json()) == lost and "s" not in game("u", 0).to_json()
    three = shard("t", [lost, won])
    assert (three.wins, three.draws, three.losses) == (2, 1, 1)
    assert shard_refusal(three, "cand", "a" * 64, "random", 2) is None
    stranger = replace(three, games=(replace(lost, seats=(("x", -0.5), ("random", 1.0), ("cand", -0.5))), won))
    assert "seats" in shard_refusal(stranger, "cand", "a" * 64, "random", 2)
    merged = merge_shards("cand", [("random", "random")], [("random", three), ("random", three)])
    assert [(r.wins, r.draws, r.losses) for r in merged.results] == [(2, 1, 1)]
    with ModelRegistry(tmp_path / "registry.db") as registry:
        assert registry.add_match_games(g.match_game("t", "mnk3") for g in merged.games) == 2
        assert [g.seats for g in registry.match_games("t")] == [lost.seats, won.seats]
    for bad in ([["a", 1.0], ["b", -1.0]], [["a", float("nan")], ["b", 0], ["c", 0]],
                [["a", "1"], ["b", 0], ["c", 0]], "abc"):
        with pytest.raises(ValueError, match="seat"):
            ShardGame.from_json({**won.to_json(), "s": bad})


def test_recording_merged_games_twice_adds_them_once(tmp_path: Path) -> None:
    s0 = shard("r0", [game("r0#0", 0), game("r0#1", None)])
    merged = merge_shards("cand", [("random", "random")], [("random", s0)])
    with ModelRegistry(tmp_path / "registry.db") as registry:
        assert registry.add_match_games(g.match_game("r0", "connect4") for g in merged.games) == 2
        assert registry.add_match_games(g.match_game("r0", "connect4") for g in merged.games) == 0
        assert len(registry.match_results()) == 2


def test_baselines_travel_with_their_parameters() -> None:
    s = load_settings(None, gauntlet={"heuristic_depth": 3, "rollout_simulations": 50})
    assert [baseline_text(b, s) for b in ("random", "heuristic", "rollout", "heuristic:1")] == [
        "random", "heuristic:3", "rollout:50", "heuristic:1"]
