"""The leader's pure decisions about spread gauntlets: how a request is cut into shards and
which shard items should exist for the gossiped requests and results."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from app.coordination.pipeline.gauntlet_plan import (
    REQUEST_KEY, RESULTS_KEY, GauntletRequest, shard_seed, shards_of, split_games,
)
from app.coordination.pipeline.generation_log import GenerationRecord
from app.coordination.pipeline.scheduling import gauntlet_specs

pytestmark = pytest.mark.timeout(30)
SHA = "c" * 64


def request(generation: int = 3, claimant: str = "n1", games: int = 8, shard_games: int = 4,
            sha: str = SHA) -> GauntletRequest:
    return GauntletRequest(generation, sha, claimant, net_simulations=8, shard_games=shard_games,
                           baselines={"random": ("random", games), "heuristic": ("heuristic:2", games)})


def inv(req: GauntletRequest | None = None, results: dict | None = None) -> dict:
    return {REQUEST_KEY: None if req is None else req.to_json(), RESULTS_KEY: results or {}}


@given(st.integers(0, 500), st.integers(1, 40))
def test_shards_sum_to_the_games_asked_and_play_whole_pairs(total: int, shard_games: int) -> None:
    sizes = split_games(total, shard_games)
    assert sum(sizes) == total
    assert all(s % 2 == 0 for s in sizes[:-1]) and all(s > 0 for s in sizes)
    assert len(set(sizes[:-1])) <= 1 and (not sizes or sizes[0] >= sizes[-1])


def test_a_request_is_cut_into_items_with_distinct_seeds() -> None:
    shards = shards_of(request(games=10, shard_games=4))
    assert [s.item_id for s in shards] == [
        "gauntlet:generation-3-cccccccccccc-random-0", "gauntlet:generation-3-cccccccccccc-random-1", "gauntlet:generation-3-cccccccccccc-random-2",
        "gauntlet:generation-3-cccccccccccc-heuristic-0", "gauntlet:generation-3-cccccccccccc-heuristic-1",
        "gauntlet:generation-3-cccccccccccc-heuristic-2"]
    assert [s.games for s in shards] == [4, 4, 2, 4, 4, 2]
    assert len({s.seed for s in shards}) == len(shards)
    assert shards_of(request(games=10, shard_games=4)) == shards  # the same on every leader
    assert shard_seed(SHA, "random", 0) != shard_seed("d" * 64, "random", 0)
    # another candidate of the same generation (a second claimant after a lost claim) gets its
    # own items: the finished items of the first must not swallow its shards
    other = shards_of(request(games=10, shard_games=4, sha="d" * 64))
    assert not {s.item_id for s in other} & {s.item_id for s in shards}


def test_every_shard_of_a_live_claimants_request_becomes_a_claimable_item() -> None:
    specs = gauntlet_specs({"n0": inv(), "n1": inv(request())}, {"n0", "n1"}, {}, ttl=30)
    assert [s.item_id for s in specs] == [
        "gauntlet:generation-3-cccccccccccc-random-0", "gauntlet:generation-3-cccccccccccc-random-1",
        "gauntlet:generation-3-cccccccccccc-heuristic-0", "gauntlet:generation-3-cccccccccccc-heuristic-1"]
    first = specs[0]
    assert first.kind == "gauntlet" and first.requirements == {} and first.ttl == 30
    assert first.payload == {"generation": 3, "candidate_sha256": SHA, "baseline": "random", "kind": "random",
                             "games": 4, "seed": shard_seed(SHA, "random", 0), "net_simulations": 8,
                             "claimant": "n1"}
    assert specs[2].payload["baseline"] == "heuristic:2"


def test_shards_with_a_gossiped_result_for_this_candidate_are_not_scheduled_again() -> None:
    done = {"gauntlet:generation-3-cccccccccccc-random-0": {"candidate_sha256": SHA},
            "gauntlet:generation-3-cccccccccccc-heuristic-1": {"candidate_sha256": "d" * 64}}  # another candidate's
    # a dead node's results still count: what it published stays true
    specs = gauntlet_specs({"n0": inv(results=done), "n1": inv(request())}, {"n1"}, {}, ttl=30)
    assert [s.key for s in specs] == ["generation-3-cccccccccccc-random-1", "generation-3-cccccccccccc-heuristic-0",
                                      "generation-3-cccccccccccc-heuristic-1"]


def test_decided_dead_foreign_and_malformed_requests_schedule_nothing() -> None:
    decided = {3: GenerationRecord(3, SHA, True, 100, "n1")}
    assert gauntlet_specs({"n1": inv(request())}, {"n1"}, decided, 30) == []
    assert gauntlet_specs({"n1": inv(request())}, {"n0"}, {}, 30) == []  # claimant not alive
    assert gauntlet_specs({"n0": inv(request(claimant="n1"))}, {"n0"}, {}, 30) == []  # not its own
    bad = [{"generation": "x"}, {**request().to_json(), "shard_games": 0}, "nonsense",
           {**request().to_json(), "baselines": {"random": {"spec": "random", "games": 10**9}}}]
    for raw in bad:
        assert gauntlet_specs({"n1": {REQUEST_KEY: raw}}, {"n1"}, {}, 30) == []


def test_request_round_trips_through_json() -> None:
    req = request()
    assert GauntletRequest.from_json(req.to_json()) == req
