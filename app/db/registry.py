"""Model registry and recorded gauntlet games, in one SQLite file (SQLAlchemy, WAL).

The registry is what "the current best model" means: a row per model (by sha256, the model's
identity across the mesh) with its lineage, its Elo and interval, and a status with the
reason it got it. Every status change is also appended to a history table, so an operator
can see why a model was rolled back months later. Gauntlet games are stored here rather than
in the replay DB because ratings are fitted over *all* of them, across gauntlets.

Rows cross the API as frozen dataclasses, never live ORM objects.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from sqlalchemy import delete, func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app.db.registry_tables import (
    MatchGameRow, MatchSeatRow, ModelRow, ModelStatus, RatingRow, RegistryBase, RegistrySchemaInfo, StatusHistoryRow,
)
from app.db.seat_pairs import Seat, seat_pairs
from app.db.stored_paths import from_stored, to_stored
from app.db.engines import is_url
from app.db.versioned_store import StoreSchema, open_store

SCHEMA_VERSION = 1


class RegistryError(RuntimeError):
    """A registry file that cannot be used, or an action its state forbids; names the path."""


@dataclass(frozen=True)
class ModelEntry:
    sha256: str
    generation: int
    path: str
    parent_sha256: str | None
    dataset_sha256: str | None
    elo: float | None
    elo_low: float | None
    elo_high: float | None
    status: ModelStatus
    reason: str
    created_at: float
    updated_at: float
    promoted_at: float | None
    current_since: float | None

    def to_json(self) -> dict:
        return {**self.__dict__, "status": self.status.value}


@dataclass(frozen=True)
class StatusChange:
    sha256: str
    old_status: ModelStatus | None
    new_status: ModelStatus
    reason: str
    at: float


@dataclass(frozen=True)
class MatchGame:
    uid: str
    match_id: str
    game: str
    player0: str
    player1: str
    winner: int | None  # None for a draw
    moves: str
    opening_plies: int = 0
    created_at: float = 0.0
    # more than two seats: (player, return) of each seat in order; player0/player1/winner then
    # hold the two-seat summary (the candidate against the field) for readers of only them
    seats: tuple[Seat, ...] = ()

    def pair_results(self) -> list[tuple[str, str, float]]:
        """(player a, player b, a's score) rows for an Elo fit: one a game of two seats, one
        per seat pair of different players otherwise (app/db/seat_pairs.py)."""
        if self.seats:
            return seat_pairs(self.seats)
        return [(self.player0, self.player1, 0.5 if self.winner is None else (1.0 if self.winner == 0 else 0.0))]


@dataclass(frozen=True)
class StoredRating:
    player: str
    elo: float
    elo_low: float
    elo_high: float
    games: int
    updated_at: float


def _entry(row: ModelRow, root: Path | None = None) -> ModelEntry:
    return ModelEntry(
        sha256=row.sha256, generation=row.generation,
        path=row.path if root is None else from_stored(row.path, root) or row.path,
        parent_sha256=row.parent_sha256, dataset_sha256=row.dataset_sha256,
        elo=row.elo, elo_low=row.elo_low, elo_high=row.elo_high,
        status=ModelStatus(row.status), reason=row.reason,
        created_at=row.created_at, updated_at=row.updated_at,
        promoted_at=row.promoted_at, current_since=row.current_since,
    )


REGISTRY_SCHEMA = StoreSchema("registry", RegistryError, RegistryBase.metadata, RegistrySchemaInfo,
                              "registry_schema_version", SCHEMA_VERSION)


class ModelRegistry:
    """One SQLite file; safe for one writer process and many readers (WAL, busy timeout)."""

    def __init__(self, path: str | Path, create: bool = True, root: Path | None = None) -> None:
        """`path`: an SQLite file, or a database URL (app/db/engines.py). `root`: the data dir
        model paths are stored relative to (default: an SQLite file's folder; a database URL
        without one keeps them as given)."""
        self.path, self.engine = open_store(path, REGISTRY_SCHEMA, create)
        self.root = root if root is not None or is_url(path) else Path(path).parent

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> "ModelRegistry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- models -----------------------------------------------------------------------

    def _stored(self, path: str | Path) -> str:
        return str(path) if self.root is None else to_stored(path, self.root) or str(path)

    def rebase_paths(self, data_dir: Path | None = None) -> int:
        """Rewrite every model path as this registry stores it now: relative to the data dir
        (an SQLite file's), or, in a database without a root, absolute under `data_dir`; in
        both a path of a dir that moved is found again under this one. How a registry written
        with absolute paths, or restored onto another dir, is migrated at start. Returns the
        rows changed."""
        root = self.root or data_dir
        if root is None:
            return 0
        changed = 0
        with Session(self.engine) as session, session.begin():
            for row in session.scalars(select(ModelRow)):
                stored = self._stored(from_stored(row.path, root) or row.path)
                if stored != row.path:
                    row.path, changed = stored, changed + 1
        return changed

    def register(
        self, sha256: str, path: str | Path, generation: int,
        parent_sha256: str | None = None, dataset_sha256: str | None = None,
    ) -> ModelEntry:
        """Add a candidate; registering a known sha256 again returns the existing row."""
        now = time.time()
        try:
            with Session(self.engine) as session, session.begin():
                row = session.scalar(select(ModelRow).where(ModelRow.sha256 == sha256))
                if row is not None:
                    return _entry(row, self.root)
                row = ModelRow(
                    sha256=sha256, generation=int(generation), path=self._stored(path),
                    parent_sha256=parent_sha256, dataset_sha256=dataset_sha256,
                    status=ModelStatus.CANDIDATE.value, reason="registered",
                    created_at=now, updated_at=now,
                )
                session.add(row)
                session.add(StatusHistoryRow(sha256=sha256, old_status=None,
                                             new_status=ModelStatus.CANDIDATE.value,
                                             reason="registered", at=now))
                session.flush()
                return _entry(row, self.root)
        except IntegrityError:  # a concurrent writer registered it first
            entry = self.get(sha256)
            assert entry is not None
            return entry

    def get(self, sha256: str) -> ModelEntry | None:
        with Session(self.engine) as session:
            row = session.scalar(select(ModelRow).where(ModelRow.sha256 == sha256))
            return None if row is None else _entry(row, self.root)

    def require(self, sha256: str) -> ModelEntry:
        entry = self.get(sha256)
        if entry is None:
            raise RegistryError(f"{self.path}: no model with sha256 {sha256[:12]} in the registry")
        return entry

    def find(self, prefix: str) -> ModelEntry:
        """The model whose sha256 starts with `prefix` (operators type short hashes)."""
        with Session(self.engine) as session:
            rows = list(session.scalars(select(ModelRow).where(ModelRow.sha256.like(f"{prefix}%")).limit(2)))
        if not rows:
            raise RegistryError(f"{self.path}: no model with sha256 starting {prefix!r}")
        if len(rows) > 1:
            raise RegistryError(f"{self.path}: sha256 prefix {prefix!r} is ambiguous")
        return _entry(rows[0], self.root)

    def models(self) -> list[ModelEntry]:
        """Every model, by generation then registration order."""
        with Session(self.engine) as session:
            return [_entry(r, self.root) for r in session.scalars(select(ModelRow).order_by(ModelRow.generation, ModelRow.id))]

    def current_best(self) -> ModelEntry | None:
        """The promoted model made current most recently; promotions only move to newer
        generations and rollback demotes the newer ones, so this is also the newest promoted."""
        with Session(self.engine) as session:
            row = session.scalar(
                select(ModelRow).where(ModelRow.status == ModelStatus.PROMOTED.value)
                .order_by(ModelRow.current_seq.desc()).limit(1)
            )
            return None if row is None else _entry(row, self.root)

    def history(self, sha256: str | None = None) -> list[StatusChange]:
        stmt = select(StatusHistoryRow).order_by(StatusHistoryRow.id)
        if sha256 is not None:
            stmt = stmt.where(StatusHistoryRow.sha256 == sha256)
        with Session(self.engine) as session:
            return [
                StatusChange(r.sha256, None if r.old_status is None else ModelStatus(r.old_status),
                             ModelStatus(r.new_status), r.reason, r.at)
                for r in session.scalars(stmt)
            ]

    def _change(self, session: Session, row: ModelRow, status: ModelStatus, reason: str, now: float) -> None:
        session.add(StatusHistoryRow(sha256=row.sha256, old_status=row.status,
                                     new_status=status.value, reason=reason, at=now))
        row.status = status.value
        row.reason = reason
        row.updated_at = now

    def reject(self, sha256: str, reason: str) -> ModelEntry:
        now = time.time()
        with Session(self.engine) as session, session.begin():
            row = self._row(session, sha256)
            if row.status != ModelStatus.CANDIDATE.value:
                raise RegistryError(f"{self.path}: model {sha256[:12]} is {row.status}, only a candidate can be rejected")
            self._change(session, row, ModelStatus.REJECTED, reason, now)
            return _entry(row, self.root)

    def promote(self, sha256: str, reason: str) -> ModelEntry:
        """Make a candidate the current best. The caller checks the file's sha256 first
        (app.games.train.promotion.promote_model does); this only guards the state machine and
        the one-promoted-model-per-generation rule."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            row = self._row(session, sha256)
            if row.status != ModelStatus.CANDIDATE.value:
                raise RegistryError(f"{self.path}: model {sha256[:12]} is {row.status}, only a candidate can be promoted")
            rival = session.scalar(select(ModelRow).where(
                ModelRow.generation == row.generation, ModelRow.status == ModelStatus.PROMOTED.value,
                ModelRow.sha256 != sha256))
            if rival is not None:
                raise RegistryError(
                    f"{self.path}: generation {row.generation} already has promoted model "
                    f"{rival.sha256[:12]}; roll it back first")
            best = session.scalar(select(ModelRow).where(ModelRow.status == ModelStatus.PROMOTED.value)
                                  .order_by(ModelRow.current_seq.desc()).limit(1))
            if best is not None and best.generation > row.generation:
                raise RegistryError(
                    f"{self.path}: model {sha256[:12]} is generation {row.generation}, older than the "
                    f"current best's ({best.generation}): a stale candidate")
            self._change(session, row, ModelStatus.PROMOTED, reason, now)
            row.promoted_at = now
            self._make_current(session, row, now)
            return _entry(row, self.root)

    def rollback(self, to_sha256: str, reason: str) -> list[str]:
        """Make an earlier promoted model current again: every promoted model of a later
        generation is marked rolled_back (oldest first in the returned sha256s). Rolling
        "forward" to a rolled-back model restores it the same way."""
        now = time.time()
        with Session(self.engine) as session, session.begin():
            target = self._row(session, to_sha256)
            if target.promoted_at is None or target.status not in (ModelStatus.PROMOTED.value, ModelStatus.ROLLED_BACK.value):
                raise RegistryError(
                    f"{self.path}: model {to_sha256[:12]} is {target.status} and was never promoted; "
                    "rollback only goes to an earlier promoted model")
            later = list(session.scalars(select(ModelRow).where(
                ModelRow.status == ModelStatus.PROMOTED.value, ModelRow.generation > target.generation)
                .order_by(ModelRow.generation)))
            for row in later:
                self._change(session, row, ModelStatus.ROLLED_BACK, f"rolled back to {to_sha256[:12]}: {reason}", now)
            if target.status != ModelStatus.PROMOTED.value:
                rival = session.scalar(select(ModelRow).where(
                    ModelRow.generation == target.generation, ModelRow.status == ModelStatus.PROMOTED.value,
                    ModelRow.sha256 != to_sha256))
                if rival is not None:
                    raise RegistryError(
                        f"{self.path}: generation {target.generation} has promoted model {rival.sha256[:12]}")
                self._change(session, target, ModelStatus.PROMOTED, f"restored by rollback: {reason}", now)
            self._make_current(session, target, now)
            return [r.sha256 for r in later]

    def _make_current(self, session: Session, row: ModelRow, now: float) -> None:
        top = session.scalar(select(func.coalesce(func.max(ModelRow.current_seq), 0)))
        row.current_seq = int(top or 0) + 1
        row.current_since = now

    def _row(self, session: Session, sha256: str) -> ModelRow:
        row = session.scalar(select(ModelRow).where(ModelRow.sha256 == sha256))
        if row is None:
            raise RegistryError(f"{self.path}: no model with sha256 {sha256[:12]} in the registry")
        return row

    # --- games and ratings ------------------------------------------------------------

    def add_match_games(self, games: Iterable[MatchGame]) -> int:
        """Record gauntlet games, each idempotent by uid, with its seats in the same
        transaction; returns how many were new."""
        added = 0
        now = time.time()
        for g in games:
            try:
                with Session(self.engine) as session, session.begin():
                    if session.scalar(select(MatchGameRow.id).where(MatchGameRow.uid == g.uid)) is not None:
                        continue
                    row = MatchGameRow(
                        uid=g.uid, match_id=g.match_id, game=g.game, player0=g.player0, player1=g.player1,
                        winner=-1 if g.winner is None else int(g.winner), moves=g.moves,
                        opening_plies=g.opening_plies, created_at=g.created_at or now)
                    session.add(row)
                    if g.seats:
                        session.flush()  # the row's id, for its seats
                        session.add_all(MatchSeatRow(game_id=row.id, seat=i, player=player, result=float(result))
                                        for i, (player, result) in enumerate(g.seats))
                added += 1
            except IntegrityError:
                continue
        return added

    def match_games(self, match_id: str | None = None) -> list[MatchGame]:
        stmt = select(MatchGameRow).order_by(MatchGameRow.id)
        if match_id is not None:
            stmt = stmt.where(MatchGameRow.match_id == match_id)
        with Session(self.engine) as session:
            rows = list(session.scalars(stmt))
            seats = self._seats(session, match_id)
            return [
                MatchGame(r.uid, r.match_id, r.game, r.player0, r.player1,
                          None if r.winner < 0 else r.winner, r.moves, r.opening_plies, r.created_at,
                          seats.get(r.id, ()))
                for r in rows
            ]

    @staticmethod
    def _seats(session: Session, match_id: str | None) -> dict[int, tuple[Seat, ...]]:
        """game id -> its seats in order (games of more than two seats only), of one match or
        of every game."""
        stmt = select(MatchSeatRow).order_by(MatchSeatRow.game_id, MatchSeatRow.seat)
        if match_id is not None:
            stmt = stmt.join(MatchGameRow, MatchGameRow.id == MatchSeatRow.game_id).where(
                MatchGameRow.match_id == match_id)
        out: dict[int, list[Seat]] = {}
        for r in session.scalars(stmt):
            out.setdefault(r.game_id, []).append((r.player, r.result))
        return {game_id: tuple(seats) for game_id, seats in out.items()}

    def match_results(self) -> list[tuple[str, str, float]]:
        """(player a, player b, score of a) rows of every recorded game, the Elo fit's input:
        one a game of two seats, one per seat pair of different players for more seats."""
        with Session(self.engine) as session:
            rows = session.execute(select(MatchGameRow.id, MatchGameRow.player0, MatchGameRow.player1,
                                          MatchGameRow.winner)).all()
            seats = self._seats(session, None)
        out: list[tuple[str, str, float]] = []
        for game_id, p0, p1, w in rows:
            out += MatchGame("", "", "", p0, p1, None if w < 0 else w, "", seats=seats.get(game_id, ())).pair_results()
        return out

    def store_ratings(self, ratings: Iterable[tuple[str, float, float, float, int]],
                      model_player: dict[str, str] | None = None) -> None:
        """Replace the ratings table with (player, elo, low, high, games) rows, and copy each
        model's rating onto its registry row (`model_player` maps player name -> sha256)."""
        now = time.time()
        model_player = model_player or {}
        with Session(self.engine) as session, session.begin():
            session.execute(delete(RatingRow))
            for player, elo, low, high, games in ratings:
                session.add(RatingRow(player=player, elo=elo, elo_low=low, elo_high=high, games=games, updated_at=now))
                sha = model_player.get(player)
                if sha is not None:
                    session.execute(update(ModelRow).where(ModelRow.sha256 == sha).values(
                        elo=elo, elo_low=low, elo_high=high, updated_at=now))

    def ratings(self) -> list[StoredRating]:
        with Session(self.engine) as session:
            return [StoredRating(r.player, r.elo, r.elo_low, r.elo_high, r.games, r.updated_at)
                    for r in session.scalars(select(RatingRow).order_by(RatingRow.elo.desc()))]
