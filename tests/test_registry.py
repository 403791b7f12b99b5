"""Model registry: statuses, current best, rollback round trip, match games, ratings, schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from app.db.registry import MatchGame, ModelRegistry, ModelStatus, RegistryError


def sha(n: int) -> str:
    return f"{n:064x}"


@pytest.fixture
def registry(db_target):  # an SQLite file, then a PostgreSQL database (tests/db_backends.py)
    reg = ModelRegistry(db_target)
    yield reg
    reg.close()


def test_register_is_idempotent_and_starts_as_candidate(registry: ModelRegistry) -> None:
    a = registry.register(sha(1), "/m/a.safetensors", 0, None, sha(99))
    again = registry.register(sha(1), "/elsewhere.safetensors", 5)
    assert a == again
    assert a.status is ModelStatus.CANDIDATE and a.dataset_sha256 == sha(99)
    assert registry.current_best() is None
    assert [m.sha256 for m in registry.models()] == [sha(1)]


def test_states_and_rollback_round_trip(db_target, registry: ModelRegistry) -> None:
    for g in range(4):
        registry.register(sha(g), f"/m/{g}.safetensors", g, sha(g - 1) if g else None)
    registry.promote(sha(0), "gen 0 gate passed")
    registry.promote(sha(1), "gen 1 gate passed")
    registry.reject(sha(2), "SPRT rejects")
    registry.promote(sha(3), "gen 3 gate passed")
    assert registry.current_best().sha256 == sha(3)

    undone = registry.rollback(sha(1), "gen 3 regressed")
    assert undone == [sha(3)]
    assert registry.current_best().sha256 == sha(1)
    assert registry.get(sha(3)).status is ModelStatus.ROLLED_BACK
    assert "gen 3 regressed" in registry.get(sha(3)).reason
    assert registry.get(sha(2)).status is ModelStatus.REJECTED

    # Rolling forward again to the rolled-back model restores it as current.
    assert registry.rollback(sha(3), "false alarm") == []
    assert registry.current_best().sha256 == sha(3)
    assert registry.get(sha(3)).status is ModelStatus.PROMOTED
    assert registry.get(sha(1)).status is ModelStatus.PROMOTED
    assert registry.rollback(sha(0), "back to the start") == [sha(1), sha(3)]
    assert registry.current_best().sha256 == sha(0)
    assert registry.history(sha(1))[-1].reason.startswith("rolled back to")

    # Everything survives a reopen, history included.
    registry.close()
    reopened = ModelRegistry(db_target)
    try:
        assert reopened.current_best().sha256 == sha(0)
        statuses = [(c.old_status, c.new_status) for c in reopened.history(sha(3))]
        assert statuses == [
            (None, ModelStatus.CANDIDATE), (ModelStatus.CANDIDATE, ModelStatus.PROMOTED),
            (ModelStatus.PROMOTED, ModelStatus.ROLLED_BACK), (ModelStatus.ROLLED_BACK, ModelStatus.PROMOTED),
            (ModelStatus.PROMOTED, ModelStatus.ROLLED_BACK),
        ]
    finally:
        reopened.close()


def test_illegal_transitions_are_refused(registry: ModelRegistry) -> None:
    registry.register(sha(1), "/m/1", 1)
    registry.register(sha(2), "/m/2", 1)
    registry.register(sha(3), "/m/3", 2)
    with pytest.raises(RegistryError, match="never promoted"):
        registry.rollback(sha(1), "x")
    registry.promote(sha(1), "ok")
    with pytest.raises(RegistryError, match="only a candidate"):
        registry.promote(sha(1), "again")
    with pytest.raises(RegistryError, match="generation 1 already has promoted"):
        registry.promote(sha(2), "a second model for generation 1")
    registry.register(sha(4), "/m/4", 0)
    with pytest.raises(RegistryError, match="stale candidate"):
        registry.promote(sha(4), "older than the best")
    registry.reject(sha(3), "weak")
    with pytest.raises(RegistryError, match="only a candidate"):
        registry.reject(sha(3), "twice")
    with pytest.raises(RegistryError, match="no model"):
        registry.promote(sha(42), "unknown")


def test_find_by_prefix(registry: ModelRegistry) -> None:
    registry.register("ab" + "0" * 62, "/m/1", 0)
    registry.register("ac" + "0" * 62, "/m/2", 1)
    assert registry.find("ab").generation == 0
    with pytest.raises(RegistryError, match="ambiguous"):
        registry.find("a")
    with pytest.raises(RegistryError, match="no model"):
        registry.find("ff")


def test_match_games_are_idempotent_and_feed_elo(registry: ModelRegistry) -> None:
    games = [MatchGame(f"m1-{i}", "m1", "connect4", "random" if i % 2 else "x", "x" if i % 2 else "random",
                       winner, "4455", 2) for i, winner in enumerate([1, 0, None, 1])]
    assert registry.add_match_games(games) == 4
    assert registry.add_match_games(games) == 0
    assert len(registry.match_games("m1")) == 4
    assert registry.match_results() == [("x", "random", 0.0), ("random", "x", 1.0),
                                        ("x", "random", 0.5), ("random", "x", 0.0)]
    # three seats: each seat's player and return kept; Elo reads the pairs of different players
    three = MatchGame("m2-0", "m2", "mnk3", "c", "o", 1, "a1 b2 c3", 0, seats=(("o", -0.5), ("c", -0.5), ("o", 1.0)))
    assert registry.add_match_games([three, three]) == 1
    assert [(g.uid, g.seats) for g in registry.match_games("m2")] == [("m2-0", three.seats)]
    assert [g.seats for g in registry.match_games()] == [()] * 4 + [three.seats]
    assert registry.match_results()[4:] == [("o", "c", 0.5), ("c", "o", 0.0)]


def test_a_registry_from_before_seats_opens_and_keeps_its_games(tmp_path: Path) -> None:
    """A registry written before games kept their seats (no match_seats table) is refused
    nothing: the table is made on open, its games read as two seats, new ones keep theirs."""
    path = tmp_path / "old.sqlite"
    with ModelRegistry(path) as registry:
        registry.add_match_games([MatchGame("old-0", "old", "mnk3", "c", "o", 0, "a1", 0)])
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE match_seats")
    with ModelRegistry(path) as registry:
        assert [(g.uid, g.seats) for g in registry.match_games()] == [("old-0", ())]
        assert registry.match_results() == [("c", "o", 1.0)]
        seats = (("c", 1.0), ("o", -0.5), ("o", -0.5))
        assert registry.add_match_games([MatchGame("new-0", "new", "mnk3", "c", "o", 0, "a1", 0, seats=seats)]) == 1
        assert registry.match_results() == [("c", "o", 1.0), ("c", "o", 1.0), ("c", "o", 1.0)]


def test_ratings_are_copied_onto_models(registry: ModelRegistry) -> None:
    registry.register(sha(1), "/m/1", 0)
    registry.store_ratings([("random", 0.0, 0.0, 0.0, 10), (f"model:{sha(1)}:s8", 300.0, 200.0, 400.0, 10)],
                           {f"model:{sha(1)}:s8": sha(1)})
    entry = registry.get(sha(1))
    assert (entry.elo, entry.elo_low, entry.elo_high) == (300.0, 200.0, 400.0)
    assert [r.player for r in registry.ratings()] == [f"model:{sha(1)}:s8", "random"]
    registry.store_ratings([("random", 0.0, 0.0, 0.0, 12)])
    assert [r.games for r in registry.ratings()] == [12]


def test_newer_schema_and_garbage_files_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite"
    ModelRegistry(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_info SET value='99' WHERE key='registry_schema_version'")
    with pytest.raises(RegistryError, match="newer"):
        ModelRegistry(path)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"this is not a database" * 100)
    with pytest.raises(RegistryError, match=str(junk)):
        ModelRegistry(junk)
    with pytest.raises(RegistryError, match="not found"):
        ModelRegistry(tmp_path / "missing.sqlite", create=False)
