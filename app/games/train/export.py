"""Replay DBs -> an NPZ training dataset (see app/games/train/dataset.py for the layout).

Every input DB is opened and read completely before anything is written, so a missing,
locked or corrupt DB is reported by its path and leaves no output at all. The dataset is
built in a temporary sibling directory, fsynced, and renamed into place: a reader sees the
whole dataset or none of it.

Which games land in the holdout split depends only on a hash of the game uid, so the split is
the same on every node, in every export, whatever the window: a game used for holdout in one
generation never becomes training data for the next, and holdout losses stay comparable.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from sqlalchemy.exc import SQLAlchemyError

from app.atomic_files import replace_dir
from app.db.engines import display_name, is_url
from app.db.replay_db import GameRecord, ReplayDB, ReplayDBError
from app.games.train.data_quality import data_quality
from app.games import Game, GameError, GameState, get_game, result_scale
from app.games.train.dataset import DATASET_FORMAT, HOLDOUT_NAME, MANIFEST_NAME, TRAIN_NAME, Arrays
from app.shared.manifests import bytes_sha256, file_digest


class ExportError(RuntimeError):
    """An export that cannot be made; the message names the offending DB or game."""


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest: dict
    dataset_sha256: str


# ---- pure decisions ---------------------------------------------------------------------


def holdout_score(uid: str) -> float:
    """A uniform number in [0, 1) fixed by the uid alone (first 8 bytes of its sha256)."""
    return int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest()[:8], "big") / 2.0**64


def is_holdout(uid: str, fraction: float) -> bool:
    return holdout_score(uid) < fraction


def select_window(
    per_input: Sequence[Sequence[GameRecord]], window_games: int
) -> tuple[list[GameRecord], int]:
    """The newest `window_games` distinct games over all inputs, oldest first, and how many
    duplicates (a uid already seen in an earlier input or earlier in the same one) were dropped.

    "Newest" is by (finished_at, uid), not by DB row id: rows synced from peers arrive out of
    order, and the tie-break on uid makes the choice independent of the input order.
    """
    seen: dict[str, GameRecord] = {}
    duplicates = 0
    for records in per_input:
        for record in records:
            if record.uid in seen:
                duplicates += 1
            else:
                seen[record.uid] = record
    ordered = sorted(seen.values(), key=lambda r: (r.finished_at, r.uid))
    return ordered[max(0, len(ordered) - window_games):], duplicates


@dataclass(frozen=True)
class WindowGrowth:
    """A training window that grows with the data (KataGo's shape): every game while there
    are at most `base_games`, then base * (1 + beta * ((total / base) ** alpha - 1) / alpha),
    so early generations do not train on a fixed window mostly made of the first, weakest
    games, and later ones still see more data than a fixed small window allows."""

    base_games: int
    alpha: float = 0.75
    beta: float = 0.4

    def size(self, total_games: int, cap: int) -> int:
        if self.base_games <= 0 or not 0 < self.alpha <= 1 or self.beta < 0:
            raise ExportError(f"window growth needs base_games > 0, 0 < alpha <= 1, beta >= 0; got {self}")
        if total_games <= self.base_games:
            return min(total_games, cap)
        ratio = total_games / self.base_games
        grown = self.base_games * (1.0 + self.beta * (ratio ** self.alpha - 1.0) / self.alpha)
        return max(1, min(cap, int(grown)))

    @staticmethod
    def from_config(base_games: int, alpha: float, beta: float) -> "WindowGrowth | None":
        """None (a fixed window) when `base_games` is 0, the config's default."""
        return WindowGrowth(base_games, alpha, beta) if base_games > 0 else None


def value_target(outcome: float, search_value: float, mix: float) -> float:
    """The value head's target: the game's result, mixed with the search's root value by
    `mix` (a lower-variance target: one game's result is a single noisy sample of the value)."""
    return (1.0 - mix) * outcome + mix * float(search_value)


def seat_targets(game: Game, final: GameState, sampled: Sequence[GameState], search_values: Sequence[float],
                 value_mix: float, length_discount: float) -> np.ndarray:
    """The value targets of a game with one value a seat: (n, N), row i the final scaled
    returns from sample i's mover on (entry k: seat (to_move + k) % N); `value_mix` mixes the
    search's root value (the mover's) into entry 0 only. A record that does not end is refused."""
    if not final.is_terminal:
        raise GameError("the moves do not finish the game")
    returns = np.asarray(final.scaled_returns(length_discount), dtype=np.float64)
    rows = np.stack([np.roll(returns, -s.to_move) for s in sampled])
    if value_mix:
        rows[:, 0] = [value_target(r, v, value_mix) for r, v in zip(rows[:, 0], search_values)]
    return rows.astype(np.float32)


def outcome_for(winner: int | None, to_move: int) -> float:
    """Final result from the view of the side to move: +1 win, 0 draw, -1 loss."""
    if winner is None:
        return 0.0
    return 1.0 if winner == to_move else -1.0


# ---- samples ------------------------------------------------------------------------------


def game_samples(game: Game, record: GameRecord, augment: bool, value_mix: float = 0.0,
                 length_discount: float = 0.0) -> Arrays:
    """Replay one game through the rules: its samples (planes, visit targets, value targets),
    one per position (times the number of symmetries when `augment`, each position's images
    next to each other); moves self-play marked as fast searches (`search["fast_plies"]`,
    playout-cap randomisation) and the random opening a game started with
    (`search["opening_plies"]`) are played but not sampled. The result is worth
    `result_scale(moves in the game, ...)` with `length_discount` (the search's
    SearchConfig.length_discount: targets and search must agree on what a result is worth).
    The planes and images of a game are made in one batch (`Game.stacked_planes`,
    `Game.symmetries`): one position at a time was half of an export's time.
    A record the rules reject raises GameError."""
    search = record.search if isinstance(record.search, dict) else {}
    opening = search.get("opening_plies", 0)
    if not isinstance(opening, int) or isinstance(opening, bool) or not 0 <= opening <= len(record.moves):
        raise GameError(f"opening_plies {opening!r} is not a count of the game's {len(record.moves)} moves")
    fast = set(search.get("fast_plies", ())) | set(range(opening))
    state = game.initial_state()
    scale = result_scale(len(record.moves), state.max_plies, length_discount)
    sampled: list[GameState] = []
    plies: list[int] = []
    value: list[float] = []
    for ply, move in enumerate(record.moves):
        if ply not in fast:
            sampled.append(state)
            plies.append(ply)
            target = outcome_for(record.winner, state.to_move) * scale
            value.append(value_target(target, move.root_value, value_mix) if value_mix else target)
        state = state.play(int(move.action))
    if state.is_terminal and state.winner != record.winner:
        raise GameError(f"recorded winner {record.winner} but the moves end with winner {state.winner}")
    if not sampled:
        return Arrays.empty(game.plane_shape, game.num_actions, game.value_size)
    targets = _visit_targets(game, record, plies)
    planes, values = game.stacked_planes(sampled), np.asarray(value, np.float32)
    if game.value_size > 1:
        values = seat_targets(game, state, sampled, [record.moves[p].root_value for p in plies], value_mix,
                              length_discount)
    if not augment:
        return Arrays(planes, targets, values)
    images = game.symmetries(planes, targets)
    return Arrays(np.stack([p for p, _ in images], axis=1).reshape(-1, *game.plane_shape),
                  np.stack([q for _, q in images], axis=1).reshape(-1, game.num_actions),
                  np.repeat(values, len(images), axis=0))


def _visit_targets(game: Game, record: GameRecord, plies: list[int]) -> np.ndarray:
    """The normalised visit distributions of the moves at `plies` (N, num_actions); a move
    with no visits recorded targets the move played. GameError names the first bad move."""
    try:
        visits = np.asarray([record.moves[ply].visits for ply in plies], dtype=np.float32)
    except (ValueError, TypeError):  # ragged or not numbers: found and named below
        visits = None
    if visits is not None and visits.shape == (len(plies), game.num_actions):
        bad = ~(np.isfinite(visits).all(axis=1) & (visits >= 0).all(axis=1))
    else:
        bad = np.ones(len(plies), dtype=bool)
    if bad.any():
        ply = plies[int(np.argmax(bad))]
        shape = np.shape(np.asarray(record.moves[ply].visits, dtype=object))
        raise GameError(f"move {ply}: visit distribution of shape {shape} is not {game.num_actions} non-negative numbers")
    totals = visits.sum(axis=1, keepdims=True)
    empty = totals[:, 0] <= 0
    visits = visits / np.where(totals > 0, totals, 1.0)
    for row in np.flatnonzero(empty):
        visits[row, record.moves[plies[row]].action] = 1.0
    return visits


def build_arrays(game: Game, records: Iterable[GameRecord], augment: bool, source: dict[str, str],
                 value_mix: float = 0.0, length_discount: float = 0.0) -> Arrays:
    parts: list[Arrays] = []
    for record in records:
        try:
            parts.append(game_samples(game, record, augment, value_mix, length_discount))
        except (GameError, IndexError, TypeError) as exc:
            raise ExportError(f"{source.get(record.uid, '?')}: game {record.uid} is invalid: {exc}") from None
    if not parts:
        return Arrays.empty(game.plane_shape, game.num_actions, game.value_size)
    return Arrays(np.concatenate([a.planes for a in parts]).astype(np.float32, copy=False),
                  np.concatenate([a.policy for a in parts]).astype(np.float32, copy=False),
                  np.concatenate([a.value for a in parts]).astype(np.float32, copy=False))


# ---- reading inputs -----------------------------------------------------------------------


def probe_db(path: Path, lock_timeout_s: float) -> None:
    """Fail fast, naming the path, when a DB is missing, locked or not a replay DB.

    A raw read-only sqlite3 connection with a short timeout: the ORM's default wait on a lock
    is long, and an export should report a busy DB quickly rather than hang the pipeline.
    """
    if not path.is_file():
        raise ExportError(f"{path}: replay DB not found")
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=lock_timeout_s)
    except sqlite3.Error as exc:
        raise ExportError(f"{path}: cannot open replay DB: {exc}") from None
    try:
        conn.execute("SELECT value FROM schema_info WHERE key = 'schema_version'").fetchall()
        conn.execute("SELECT COUNT(*) FROM games").fetchone()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            raise ExportError(f"{path}: replay DB is locked by another process: {exc}") from None
        raise ExportError(f"{path}: not a replay DB: {exc}") from None
    except sqlite3.DatabaseError as exc:
        raise ExportError(f"{path}: corrupt replay DB: {exc}") from None
    finally:
        conn.close()


def read_db(path: Path, window_games: int, lock_timeout_s: float, check_integrity: bool) -> tuple[list[GameRecord], int]:
    """(newest `window_games` games by row, total games stored) of one DB."""
    if not is_url(path):  # a database server needs no file probe
        probe_db(path, lock_timeout_s)
    try:
        with ReplayDB(path, create=False, readonly=True) as db:
            if check_integrity:
                problems = db.integrity_problems()
                if problems:
                    raise ExportError(f"{path}: corrupt replay DB: {'; '.join(problems[:5])}")
            return db.games(newest=window_games), db.count()
    except ReplayDBError as exc:
        raise ExportError(str(exc)) from None
    except SQLAlchemyError as exc:
        raise ExportError(f"{path}: cannot read replay DB: {getattr(exc, 'orig', exc)}") from None


# ---- writing ------------------------------------------------------------------------------


NPZ_COMPRESS_LEVEL = 3  # as small as numpy's default (6) on these 0/1 planes, in 0.4 of the time


def _write_npz(path: Path, arrays: Arrays) -> None:
    """What np.savez_compressed writes (np.load reads it), at NPZ_COMPRESS_LEVEL: at the
    default level, compression was a third of an export's time once the rest got faster."""
    with open(path, "wb") as fh:
        with zipfile.ZipFile(fh, "w", zipfile.ZIP_DEFLATED, compresslevel=NPZ_COMPRESS_LEVEL) as archive:
            for name, array in (("planes", arrays.planes), ("policy", arrays.policy), ("value", arrays.value)):
                with archive.open(f"{name}.npy", "w", force_zip64=True) as member:
                    np.lib.format.write_array(member, np.ascontiguousarray(array), allow_pickle=False)
        fh.flush()
        os.fsync(fh.fileno())


def _install_dir(tmp: Path, out: Path, overwrite: bool) -> None:
    """Rename the finished temp dir into place; an existing dataset is swapped out only when
    `overwrite`, and removed after the new one is in place."""
    if out.exists() and not overwrite:
        raise ExportError(f"{out}: already exists (pass overwrite to replace it)")
    replace_dir(tmp, out)


def export_dataset(
    db_paths: Sequence[str | Path],
    out_dir: str | Path,
    *,
    window_games: int = 20000,
    holdout_fraction: float = 0.05,
    augment: bool = True,
    game: str | None = None,
    overwrite: bool = False,
    lock_timeout_s: float = 2.0,
    check_integrity: bool = True,
    value_target_mix: float = 0.0,
    window_growth: WindowGrowth | None = None,
    length_discount: float = 0.0,
) -> ExportResult:
    """Export the newest `window_games` distinct games of `db_paths` to `out_dir`.

    Symmetry augmentation applies to the training split only: the holdout split measures the
    positions as they were played. `value_target_mix` mixes the search's root value into the
    value targets of both splits, whose results are scaled by `length_discount` (see
    `game_samples`); `window_growth` shrinks the window below `window_games`
    while the inputs hold few games (see WindowGrowth). Raises ExportError (nothing written)
    on any bad input.
    """
    if not db_paths:
        raise ExportError("no input replay DBs given")
    if window_games <= 0:
        raise ExportError(f"window_games must be positive, got {window_games}")
    if not 0.0 <= holdout_fraction < 1.0:
        raise ExportError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    if not 0.0 <= value_target_mix <= 1.0:
        raise ExportError(f"value_target_mix must be in [0, 1], got {value_target_mix}")
    if not 0.0 <= length_discount < 1.0:
        raise ExportError(f"length_discount must be in [0, 1), got {length_discount}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise ExportError(f"{out}: already exists (pass overwrite to replace it)")
    paths = [p if is_url(p) else Path(p) for p in db_paths]  # a file, or a database URL (--db-url)
    per_input: list[list[GameRecord]] = []
    inputs: list[dict] = []
    source: dict[str, str] = {}
    for path in paths:
        records, total = read_db(path, window_games, lock_timeout_s, check_integrity)
        per_input.append(records)
        shown = display_name(path) if is_url(path) else str(path.resolve())
        inputs.append({"path": shown, "games_total": total, "games_read": len(records)})
        for record in records:
            source.setdefault(record.uid, str(path))
    window_used = window_games if window_growth is None else window_growth.size(
        sum(i["games_total"] for i in inputs), window_games)  # a game in two inputs counts twice here
    selected, duplicates = select_window(per_input, window_used)
    if not selected:
        raise ExportError(f"no games in {', '.join(map(str, paths))}: nothing to export")
    game_name = game or selected[0].game
    for record in selected:
        if record.game != game_name:
            raise ExportError(f"{source[record.uid]}: game {record.uid} is {record.game!r}, expected {game_name!r}")
    try:
        rules = get_game(game_name)
    except GameError as exc:
        raise ExportError(str(exc)) from None
    holdout_games = [r for r in selected if is_holdout(r.uid, holdout_fraction)]
    train_games = [r for r in selected if not is_holdout(r.uid, holdout_fraction)]
    train = build_arrays(rules, train_games, augment, source, value_target_mix, length_discount)
    holdout = build_arrays(rules, holdout_games, False, source, value_target_mix, length_discount)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        files = {}
        for name, arrays in ((TRAIN_NAME, train), (HOLDOUT_NAME, holdout)):
            _write_npz(tmp / name, arrays)
            files[name] = {"sha256": file_digest(tmp / name), "bytes": (tmp / name).stat().st_size, "samples": len(arrays)}
        manifest = {
            "format": DATASET_FORMAT,
            "game": game_name,
            "plane_shape": list(rules.plane_shape),
            "num_actions": rules.num_actions,
            "inputs": inputs,
            "window_games": window_games,
            "window_games_used": window_used,
            "value_target_mix": value_target_mix,
            "length_discount": length_discount,
            "holdout_fraction": holdout_fraction,
            "augment": augment,
            "augment_applies_to": "train",
            "counts": {
                "games": len(selected),
                "duplicates_dropped": duplicates,
                "train_games": len(train_games),
                "holdout_games": len(holdout_games),
                "train_samples": len(train),
                "holdout_samples": len(holdout),
            },
            "quality": data_quality(selected, [train.policy, holdout.policy], rules.num_actions),
            "holdout_uids_sha256": bytes_sha256("\n".join(sorted(r.uid for r in holdout_games)).encode()),
            "newest_finished_at": selected[-1].finished_at,
            "created_at": time.time(),
            "files": files,
        }
        raw = json.dumps(manifest, indent=2, sort_keys=True).encode()
        with open(tmp / MANIFEST_NAME, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fsync(fh.fileno())
        _install_dir(tmp, out, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ExportResult(out, manifest, bytes_sha256(raw))
