"""GameReplayDB: one transaction per game, idempotent by uid, refuses what it cannot trust."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from sqlalchemy import create_engine, event

from app.db import replay_db
from app.db.replay_db import SCHEMA_VERSION, GameRecord, MoveRecord, ReplayDB, ReplayDBError


def _game(uid: str, n_moves: int = 5) -> GameRecord:
    moves = [MoveRecord(i % 7, [1 / 7] * 7, 0.1 * i) for i in range(n_moves)]
    return GameRecord(uid=uid, game="connect4", moves=moves, winner=None, node_id="n1", search={"sims": 8})


def test_searched_positions_leave_out_random_openings(db_target) -> None:
    opened = _game("opened", 6)
    opened.search["opening_plies"] = 2  # two random moves before the search took over
    with ReplayDB(db_target) as db:
        assert db.count_searched_positions() == 0
        db.add_games([_game("plain", 5), opened])
        assert db.count_positions() == 11 and db.count_searched_positions() == 9


def test_insert_is_idempotent_by_uid(db_target) -> None:
    with ReplayDB(db_target) as db:
        assert db.add_game(_game("a")) is True
        assert db.add_game(_game("a")) is False
        assert db.add_games([_game("a"), _game("b", 3), _game("c", 0)]) == 2
        assert db.count() == 3 and db.count_positions() == 8
        assert db.uids() == ["a", "b", "c"]
        back = db.games(uids=["b"])[0]
        assert back.moves[2].action == 2 and back.winner is None and back.search == {"sims": 8}
        assert [g.uid for g in db.games(newest=2)] == ["b", "c"]
        assert db.integrity_problems() == []
        assert db.count_by_node("n1") == 3 and db.max_id() >= 3
    with ReplayDB(db_target) as again:  # reopened: the schema row is found, not re-created
        assert again.uids() == ["a", "b", "c"]
    if not isinstance(db_target, str):
        with sqlite3.connect(db_target) as con:  # WAL is a property of the file: readers never block the writer
            assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_record_json_round_trip() -> None:
    record = _game("x")
    assert GameRecord.from_json(record.to_json()).to_json() == record.to_json()


def test_table_creation_outlasts_a_racer_that_makes_every_table_first(tmp_path) -> None:
    """A writer and its readers open a new games.db together, and create_all looks, then
    creates: a racer can make any table in between. Here a second real connection makes each
    table just before this one's CREATE, every time, so each attempt loses once per table; three
    attempts (the old bound) were fewer than the tables (six threads failed 2 rounds in 40)."""
    path = tmp_path / "games.db"
    racer = create_engine(f"sqlite:///{path}")
    raced: list[str] = []

    def make_it_first(table, connection, **_) -> None:
        if connection.engine is racer:
            return
        with racer.begin() as other:
            table.create(other, checkfirst=True)
        raced.append(table.name)

    tables = list(replay_db.Base.metadata.sorted_tables)
    for table in tables:
        event.listen(table, "before_create", make_it_first)
    try:
        with ReplayDB(path) as db:
            assert db.count() == 0
    finally:
        for table in tables:
            event.remove(table, "before_create", make_it_first)
        racer.dispose()
    assert sorted(raced) == sorted(t.name for t in tables) and len(tables) >= 3
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM schema_info").fetchone()[0] == 1


def test_many_threads_opening_one_new_file_all_succeed(tmp_path) -> None:
    threads = 8
    path = tmp_path / "games.db"
    start, failures = threading.Barrier(threads), []

    def open_it() -> None:
        start.wait()
        try:
            ReplayDB(path).close()
        except ReplayDBError as exc:
            failures.append(str(exc))

    workers = [threading.Thread(target=open_it) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in workers) and failures == []
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM schema_info").fetchone()[0] == 1


def test_newer_schema_is_refused(tmp_path) -> None:
    path = tmp_path / "g.db"
    ReplayDB(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE schema_info SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION + 1),))
    with pytest.raises(ReplayDBError, match="newer than this program"):
        ReplayDB(path)


def test_corrupt_and_missing_files_are_named(tmp_path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(ReplayDBError, match=str(bad)):
        ReplayDB(bad)
    with pytest.raises(ReplayDBError, match="not found"):
        ReplayDB(tmp_path / "absent.db", create=False)


WRITER = textwrap.dedent(
    """
    import sys
    from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
    db = ReplayDB(sys.argv[1])
    i = 0
    print("ready", flush=True)
    while True:
        moves = [MoveRecord(j % 7, [1 / 7] * 7, 0.0) for j in range(40)]
        db.add_game(GameRecord(uid=f"g{i}", game="connect4", moves=moves, winner=i % 2))
        i += 1
    """
)


@pytest.mark.timeout(60)
def test_kill_9_of_a_writer_leaves_only_whole_games(tmp_path) -> None:
    path = tmp_path / "g.db"
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(0.5 + 0.3 * attempt)
            os.kill(proc.pid, signal.SIGKILL)
        finally:
            proc.kill()
            proc.wait(timeout=10)
        with ReplayDB(path) as db:
            assert db.integrity_problems() == []
            assert all(len(g.moves) == 40 for g in db.games())
            count = db.count()
    assert count > 0


def test_a_game_missing_moves_is_an_integrity_problem_by_uid(tmp_path) -> None:
    path = tmp_path / "games.db"
    with ReplayDB(path) as db:
        db.add_games([_game("whole", 5), _game("damaged", 6)])
    with sqlite3.connect(path) as con:  # damage from outside: one move of one game gone
        con.execute("DELETE FROM moves WHERE ply = 3 AND game_id = (SELECT id FROM games WHERE uid = 'damaged')")
    with ReplayDB(path) as db:
        assert db.integrity_problems() == ["game damaged: 5 moves stored, 6 recorded"]
