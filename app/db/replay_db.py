"""GameReplayDB: finished games and their search statistics, in SQLite via SQLAlchemy.

A game and all its moves go in one transaction (a batch of games in one) and a game's uid is
unique, so a writer killed at any moment leaves either the whole game or nothing, and a re-sync of the same
games from a peer inserts nothing twice. WAL mode lets export read while self-play writes.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np
from sqlalchemy import (
    Float, ForeignKey, Integer, LargeBinary, String, Text, func, insert, select,
)
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from app.db.versioned_store import StoreSchema, open_store, parent_child_problems

SCHEMA_VERSION = 1


class ReplayDBError(RuntimeError):
    """A replay DB that cannot be used: missing, locked, corrupt or too new; names the path."""


class Base(DeclarativeBase):
    pass


class SchemaInfo(Base):
    __tablename__ = "schema_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class GameRow(Base):
    __tablename__ = "games"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    uid: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    game: Mapped[str] = mapped_column(String(32))
    config_json: Mapped[str] = mapped_column(Text, default="{}")
    search_json: Mapped[str] = mapped_column(Text, default="{}")
    model_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    node_id: Mapped[str] = mapped_column(String(128), default="")
    winner: Mapped[int] = mapped_column(Integer)  # 0, 1, or -1 for a draw
    length: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float] = mapped_column(Float)
    inserted_at: Mapped[float] = mapped_column(Float)
    moves: Mapped[list["MoveRow"]] = relationship(
        back_populates="game_row", order_by="MoveRow.ply", cascade="all, delete-orphan"
    )


class MoveRow(Base):
    __tablename__ = "moves"
    game_id: Mapped[int] = mapped_column(ForeignKey("games.id", ondelete="CASCADE"), primary_key=True)
    ply: Mapped[int] = mapped_column(Integer, primary_key=True)
    action: Mapped[int] = mapped_column(Integer)
    visits: Mapped[bytes] = mapped_column(LargeBinary)  # float32 visit distribution over actions
    root_value: Mapped[float] = mapped_column(Float)  # search value, side to move's view
    game_row: Mapped[GameRow] = relationship(back_populates="moves")


@dataclass(frozen=True)
class MoveRecord:
    action: int
    visits: Sequence[float]  # normalised MCTS visit distribution, length num_actions
    root_value: float = 0.0


@dataclass(frozen=True)
class GameRecord:
    """One finished game as self-play, the gauntlet and sync exchange it."""

    uid: str
    game: str
    moves: Sequence[MoveRecord]
    winner: int | None  # None for a draw
    model_sha256: str | None = None
    node_id: str = ""
    search: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    started_at: float = 0.0
    finished_at: float = 0.0

    def to_json(self) -> dict:
        return {
            "uid": self.uid, "game": self.game, "winner": self.winner,
            "model_sha256": self.model_sha256, "node_id": self.node_id,
            "search": self.search, "config": self.config,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "moves": [[m.action, [float(v) for v in m.visits], float(m.root_value)] for m in self.moves],
        }

    @staticmethod
    def from_json(data: dict) -> "GameRecord":
        return GameRecord(
            uid=str(data["uid"]), game=str(data["game"]), winner=data["winner"],
            model_sha256=data.get("model_sha256"), node_id=str(data.get("node_id", "")),
            search=dict(data.get("search", {})), config=dict(data.get("config", {})),
            started_at=float(data.get("started_at", 0.0)), finished_at=float(data.get("finished_at", 0.0)),
            moves=[MoveRecord(int(a), list(v), float(r)) for a, v, r in data["moves"]],
        )


REPLAY_SCHEMA = StoreSchema("replay DB", ReplayDBError, Base.metadata, SchemaInfo, "schema_version", SCHEMA_VERSION)


def _game_values(record: GameRecord, now: float) -> dict:
    return {
        "uid": record.uid, "game": record.game,
        "config_json": json.dumps(record.config, sort_keys=True),
        "search_json": json.dumps(record.search, sort_keys=True),
        "model_sha256": record.model_sha256, "node_id": record.node_id,
        "winner": -1 if record.winner is None else int(record.winner),
        "length": len(record.moves), "started_at": record.started_at or now,
        "finished_at": record.finished_at or now, "inserted_at": now,
    }


class ReplayDB:
    """One SQLite file of games. Safe for one writer process and many readers."""

    def __init__(self, path: str | Path, create: bool = True, readonly: bool = False) -> None:
        """`path`: an SQLite file, or a database URL (app/db/engines.py)."""
        self.path, self.engine = open_store(path, REPLAY_SCHEMA, create, readonly)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "ReplayDB":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_game(self, record: GameRecord) -> bool:
        """Insert one game with its moves atomically; False when its uid is already stored."""
        return self.add_games([record]) == 1

    def add_games(self, records: Iterable[GameRecord]) -> int:
        """Insert games (each with all its moves) in one transaction, skipping uids already
        stored; returns how many were new. Core statements, not the ORM's unit of work: a
        replica receives every game the cluster plays, and the ORM spent ~14 ms on each."""
        batch = list({r.uid: r for r in records}.values())  # a uid twice in one batch: once
        if not batch:
            return 0
        now = time.time()
        try:
            with self.engine.begin() as conn:
                have: set[str] = set()
                for i in range(0, len(batch), 500):
                    chunk = [r.uid for r in batch[i:i + 500]]
                    have.update(conn.scalars(select(GameRow.uid).where(GameRow.uid.in_(chunk))))
                new = [r for r in batch if r.uid not in have]
                for record in new:
                    game_id = conn.execute(insert(GameRow.__table__), _game_values(record, now)).inserted_primary_key[0]
                    if record.moves:
                        conn.execute(insert(MoveRow.__table__), [
                            {"game_id": game_id, "ply": i, "action": int(m.action),
                             "visits": np.asarray(m.visits, dtype=np.float32).tobytes(),
                             "root_value": float(m.root_value)}
                            for i, m in enumerate(record.moves)])
            return len(new)
        except IntegrityError:  # a concurrent writer stored one of them first: one at a time
            return 0 if len(batch) == 1 else sum(self.add_games([r]) for r in batch)
        except OperationalError as exc:
            raise ReplayDBError(f"{self.path}: write failed: {exc.orig}") from None

    def count(self) -> int:
        with Session(self.engine) as session:
            return int(session.scalar(select(func.count(GameRow.id))) or 0)

    def count_positions(self, node_id: str | None = None) -> int:
        """Positions (moves) stored; only those of games `node_id` created when given."""
        stmt = select(func.coalesce(func.sum(GameRow.length), 0))
        if node_id is not None:
            stmt = stmt.where(GameRow.node_id == node_id)
        with Session(self.engine) as session:
            return int(session.scalar(stmt) or 0)

    def count_searched_positions(self) -> int:
        """Positions the search chose a move in: stored moves less each game's random opening
        (`search["opening_plies"]`), which self-play played without searching. Self-play's
        throughput is this, not `count_positions`. Reads every game's metadata: for reports."""
        total = 0
        with Session(self.engine) as session:
            rows = session.execute(select(GameRow.length, GameRow.search_json).execution_options(yield_per=2000))
            for length, search_json in rows:
                total += length - int(json.loads(search_json).get("opening_plies", 0))
        return total

    def count_by_node(self, node_id: str) -> int:
        """Games this node created itself (synced copies of other nodes' games excluded)."""
        with Session(self.engine) as session:
            return int(session.scalar(select(func.count(GameRow.id)).where(GameRow.node_id == node_id)) or 0)

    def uids(self, after_id: int = 0) -> list[str]:
        """Stored uids in insertion order (optionally only rows with id > after_id)."""
        with Session(self.engine) as session:
            return list(session.scalars(select(GameRow.uid).where(GameRow.id > after_id).order_by(GameRow.id)))

    def max_id(self) -> int:
        with Session(self.engine) as session:
            return int(session.scalar(select(func.coalesce(func.max(GameRow.id), 0))) or 0)

    def games(self, uids: Sequence[str] | None = None, newest: int | None = None) -> list[GameRecord]:
        """Games by uid, or the `newest` N in insertion order (oldest first), or all."""
        return list(self.iter_games(uids=uids, newest=newest))

    def iter_games(self, uids: Sequence[str] | None = None, newest: int | None = None,
                   chunk: int = 500) -> Iterator[GameRecord]:
        """Games in insertion order, read `chunk` games at a time: one query for their rows and
        one for all their moves. Plain rows, not ORM objects: an export reads every move of
        ten thousand games or more, and lazy-loading each game's moves one query at a time
        was half of the export's time (docs/BENCHMARKS.md, "Exporting a dataset")."""
        stmt = select(*_GAME_COLUMNS).order_by(GameRow.id)
        if uids is not None:
            stmt = stmt.where(GameRow.uid.in_(list(uids)))
        elif newest is not None:
            stmt = stmt.where(GameRow.id > self.max_id() - newest)
        with Session(self.engine) as session:
            games = session.execute(stmt).all()
            for start in range(0, len(games), chunk):
                rows = games[start:start + chunk]
                moves: dict[int, list[MoveRecord]] = {row.id: [] for row in rows}
                for game_id, action, visits, root_value in session.execute(
                        select(MoveRow.game_id, MoveRow.action, MoveRow.visits, MoveRow.root_value)
                        .where(MoveRow.game_id.in_(list(moves))).order_by(MoveRow.game_id, MoveRow.ply)):
                    moves[game_id].append(
                        MoveRecord(action, np.frombuffer(visits, dtype=np.float32).tolist(), root_value))
                for row in rows:
                    yield _to_record(row, moves[row.id])

    def integrity_problems(self) -> list[str]:
        """Empty when the file is sound and every game has exactly its recorded number of moves."""
        return parent_child_problems(self.engine, "games", "length", "moves", "game_id", "ply", "game", "move")


_GAME_COLUMNS = (GameRow.id, GameRow.uid, GameRow.game, GameRow.winner, GameRow.model_sha256, GameRow.node_id,
                 GameRow.search_json, GameRow.config_json, GameRow.started_at, GameRow.finished_at)


def _to_record(row, moves: list[MoveRecord]) -> GameRecord:
    """A GameRecord of one row of `_GAME_COLUMNS` and its moves in ply order."""
    return GameRecord(
        uid=row.uid, game=row.game,
        winner=None if row.winner < 0 else row.winner,
        model_sha256=row.model_sha256, node_id=row.node_id,
        search=json.loads(row.search_json), config=json.loads(row.config_json),
        started_at=row.started_at, finished_at=row.finished_at,
        moves=moves,
    )
