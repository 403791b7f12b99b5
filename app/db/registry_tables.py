"""The registry's SQLite tables (ORM rows); app/db/registry.py is the API over them.

Rows never leave app/db/registry.py: callers get frozen dataclasses.
"""

from __future__ import annotations

import enum

from sqlalchemy import Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class ModelStatus(str, enum.Enum):
    CANDIDATE = "candidate"
    PROMOTED = "promoted"
    REJECTED = "rejected"
    ROLLED_BACK = "rolled_back"


class RegistryBase(DeclarativeBase):
    pass


class RegistrySchemaInfo(RegistryBase):
    __tablename__ = "schema_info"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(Text)


class ModelRow(RegistryBase):
    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    generation: Mapped[int] = mapped_column(Integer, index=True)
    path: Mapped[str] = mapped_column(Text)
    parent_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    dataset_sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    elo: Mapped[float | None] = mapped_column(Float, nullable=True)
    elo_low: Mapped[float | None] = mapped_column(Float, nullable=True)
    elo_high: Mapped[float | None] = mapped_column(Float, nullable=True)
    status: Mapped[str] = mapped_column(String(16), default=ModelStatus.CANDIDATE.value)
    reason: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    promoted_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # first promotion
    current_since: Mapped[float | None] = mapped_column(Float, nullable=True)  # last made current
    current_seq: Mapped[int | None] = mapped_column(Integer, nullable=True)  # orders "made current"


class StatusHistoryRow(RegistryBase):
    __tablename__ = "status_history"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    old_status: Mapped[str | None] = mapped_column(String(16), nullable=True)
    new_status: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text)
    at: Mapped[float] = mapped_column(Float)


class MatchGameRow(RegistryBase):
    __tablename__ = "match_games"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # `<match id>-<opponent player>-<index>` or `<shard id>#<index>`: an opponent's name holds a
    # 64-hex sha256, so no fixed width fits every uid (varchar(64) once stopped PostgreSQL nodes)
    uid: Mapped[str] = mapped_column(Text, unique=True)
    match_id: Mapped[str] = mapped_column(String(64), index=True)  # 16 hex digits
    game: Mapped[str] = mapped_column(String(32))
    player0: Mapped[str] = mapped_column(Text)  # moved first; a player spec's name, unbounded
    player1: Mapped[str] = mapped_column(Text)
    winner: Mapped[int] = mapped_column(Integer)  # 0, 1, or -1 for a draw
    moves: Mapped[str] = mapped_column(Text)  # the game's notation, opening included
    opening_plies: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("ix_match_games_players", "player0", "player1"),)


class MatchSeatRow(RegistryBase):
    """Each seat of a game of more than two seats: who sat there and its return. player0/player1
    of its match_games row keep the two-seat summary (the candidate against the field), so a
    reader that knows only them still reads the game; a two-seat game has no rows here, and a
    registry made before this table gets it empty on its next open (create_all)."""
    __tablename__ = "match_seats"
    game_id: Mapped[int] = mapped_column(ForeignKey("match_games.id", ondelete="CASCADE"), primary_key=True)
    seat: Mapped[int] = mapped_column(Integer, primary_key=True)
    player: Mapped[str] = mapped_column(Text)
    result: Mapped[float] = mapped_column(Float)  # the seat's return, e.g. +1 the winner, -0.5 a loser of three


class RatingRow(RegistryBase):
    __tablename__ = "ratings"
    player: Mapped[str] = mapped_column(Text, primary_key=True)
    elo: Mapped[float] = mapped_column(Float)
    elo_low: Mapped[float] = mapped_column(Float)
    elo_high: Mapped[float] = mapped_column(Float)
    games: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[float] = mapped_column(Float)
