"""Every stored string fits its column on PostgreSQL, which enforces a varchar's length (SQLite
ignores it: a gauntlet's 92-character game uid once stopped PostgreSQL nodes at generation 2
while every SQLite test passed). A bounded column must be as wide as the bound its producers
enforce; anything without such a bound is `Text`."""

from __future__ import annotations

import typing

import pytest
from sqlalchemy import String, Text, text

from app.coordination.daemons.events import EventType
from app.coordination.sync.wire import MAX_UID_LEN
from app.db import dead_letters, registry_tables, replay_db, rollout_store, versioned_store, work_queue
from app.db.dead_letters import DeadLetterStatus
from app.db.registry import MatchGame, ModelRegistry
from app.db.registry_tables import ModelStatus
from app.db.rollout_records import RolloutGroupRecord, RolloutSampleRecord
from app.lm.rollout.groups import DROP_REASONS

pytestmark = pytest.mark.timeout(120)

SHA = "0123456789abcdef" * 4


def _field_max(model: type, name: str) -> int:
    return next(m.max_length for m in model.model_fields[name].metadata if hasattr(m, "max_length"))


def _literal_max(model: type, name: str) -> int:
    args = [a for a in typing.get_args(model.model_fields[name].annotation) if a is not type(None)]
    values = [v for a in args for v in (typing.get_args(a) or (a,))]
    return max(len(v) for v in values)


def _bounds() -> dict[tuple[str, str], int]:
    """(table, column) -> the longest value any producer can store there."""
    group, sample = RolloutGroupRecord, RolloutSampleRecord
    return {
        # schema version rows: keys are constants of the code
        ("schema_info", "key"): 64, ("rollout_schema_info", "key"): 64,
        # sha256 hex digits (a model's identity) and statuses (enums)
        ("models", "sha256"): 64, ("models", "parent_sha256"): 64, ("models", "dataset_sha256"): 64,
        ("models", "status"): max(len(s.value) for s in ModelStatus),
        ("status_history", "sha256"): 64,
        ("status_history", "old_status"): max(len(s.value) for s in ModelStatus),
        ("status_history", "new_status"): max(len(s.value) for s in ModelStatus),
        ("match_games", "match_id"): 64, ("match_games", "game"): 32,
        # the replay DB: what game sync accepts from a peer is bounded by the wire schema
        ("games", "uid"): MAX_UID_LEN, ("games", "game"): 32, ("games", "model_sha256"): 64,
        ("games", "node_id"): 128,
        # rollouts: validated by app/db/rollout_records.py before they are stored
        ("rollout_groups", "uid"): _field_max(group, "uid"), ("rollout_groups", "node_id"): _field_max(group, "node_id"),
        ("rollout_groups", "task"): _field_max(group, "task"), ("rollout_groups", "prompt_id"): _field_max(group, "prompt_id"),
        ("rollout_groups", "model_sha256"): _field_max(group, "model_sha256"),
        ("rollout_samples", "finish_reason"): _literal_max(sample, "finish_reason"),
        # a dropped group's tombstone: the uid, node and prompt of the group it would have been
        # (app/lm/rollout/batches.py), and one of the drop reasons
        ("rollout_dropped", "uid"): _field_max(group, "uid"), ("rollout_dropped", "node_id"): _field_max(group, "node_id"),
        ("rollout_dropped", "prompt_id"): _field_max(group, "prompt_id"),
        ("rollout_dropped", "reason"): max(len(r) for r in DROP_REASONS),
        ("rollout_samples", "truncation_reason"): _literal_max(sample, "truncation_reason"),
        # the leader's work queue: item ids and node ids are bounded by the mesh schemas
        ("work_items", "item_id"): 512, ("work_items", "kind"): 64, ("work_items", "key"): 440,
        ("work_items", "state"): max(len(s) for s in (work_queue.PENDING, work_queue.CLAIMED, work_queue.DONE,
                                                      work_queue.FAILED)),
        ("work_items", "claimed_by"): 128, ("work_items", "last_error"): 4096,  # cut to 4096 when stored
        # dead letters: event types and statuses are enums
        ("dead_letters", "event_type"): max(len(t.value) for t in EventType),
        ("dead_letters", "event_key"): 64,
        ("dead_letters", "status"): max(len(s.value) for s in DeadLetterStatus),
    }


STORES = [registry_tables.RegistryBase.metadata, replay_db.Base.metadata, rollout_store.Base.metadata,
          work_queue.Base.metadata, dead_letters.DeadLetterBase.metadata]


def test_every_bounded_column_is_as_wide_as_what_is_stored_there() -> None:
    bounds = _bounds()
    seen = set()
    for metadata in STORES:
        for table in metadata.tables.values():
            for column in table.columns:
                if not isinstance(column.type, String) or isinstance(column.type, Text):
                    continue
                where = (table.name, column.name)
                seen.add(where)
                assert where in bounds, f"{where}: String({column.type.length}) with no known bound: size it or make it Text"
                assert column.type.length >= bounds[where], f"{where}: {column.type.length} < {bounds[where]}"
    assert seen == set(bounds), set(bounds) - seen
    for unbounded in (("match_games", "uid"), ("match_games", "player0"), ("match_games", "player1")):
        assert isinstance(registry_tables.RegistryBase.metadata.tables[unbounded[0]].c[unbounded[1]].type, Text)


def test_gauntlet_games_and_ratings_with_real_player_names_are_stored(db_target) -> None:
    """The uid and player names the gauntlet really writes (app/games/train/gauntlet.py), on both backends."""
    best, candidate = f"model:{SHA}:s32", f"model:{SHA[::-1]}:s32"
    uid = f"{'f' * 16}-{best}-12"
    assert len(uid) > 90
    with ModelRegistry(db_target) as registry:
        assert registry.add_match_games([MatchGame(uid, "f" * 16, "connect4", candidate, best, 0, "4455", 2)]) == 1
        registry.store_ratings([(best, 0.0, 0.0, 0.0, 1), (candidate, 40.0, -90.0, 170.0, 1)])
        assert [g.uid for g in registry.match_games()] == [uid]
        assert {r.player for r in registry.ratings()} == {best, candidate}


def test_a_postgresql_table_made_narrow_by_an_older_version_is_widened(postgres_server) -> None:
    url = postgres_server.create_database()
    with ModelRegistry(url) as registry:
        with registry.engine.begin() as conn:  # what an older version of this program created
            conn.execute(text("ALTER TABLE match_games ALTER COLUMN uid TYPE VARCHAR(64)"))
            conn.execute(text("ALTER TABLE ratings ALTER COLUMN player TYPE VARCHAR(128)"))
    versioned_store._widened.clear()  # a new process opening that database
    with ModelRegistry(url) as registry:
        uid = f"{'e' * 16}-model:{SHA}:s32-0"
        assert registry.add_match_games([MatchGame(uid, "e" * 16, "connect4", "random", f"model:{SHA}:s32", 1, "44", 2)]) == 1
        assert registry.match_games()[0].uid == uid
