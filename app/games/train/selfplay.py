"""Self-play: worker processes play many games at once and one writer stores them.

    summary = run_selfplay(games=200, simulations=64, db_path="games.db", model_path=None,
                           workers=2, seed=1, node_id="n1", settings=settings,
                           progress=lambda done: ..., should_stop=lambda: False)

Each worker is a process of app/games/worker_processes.py's forkserver with one torch thread. It plays
`settings.selfplay.concurrent_games` games concurrently, so each search round sends one
batch of that many leaves to the evaluator (the network, or a uniform prior when
`model_path` is None), and sends every finished game to the caller's process. There one
thread writes each game to the ReplayDB in its own transaction: SQLite wants one writer,
and a kill at any moment leaves whole games only. `workers=0` plays in the calling process
(no worker process; tests, benchmarks, tiny runs). A caller that plays batch after batch (the
self-play daemon) passes a `selfplay_pool.WorkerPool`, whose workers live between calls.

It is safe to call from a thread (the daemons and the gauntlet do): it installs no signal
handlers and keeps no global state. `should_stop()` is polled between games and search
rounds; on True the workers drop unfinished games and the call returns what was stored.
Workers exit on their own when the writer dies (they poll their parent's pid).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from app.games.search.model_meta import ModelFormatError, read_meta
from app.config import Settings
from app.db.replay_db import GameRecord, ReplayDB
from app.log import get_logger
from app.games.train.selfplay_games import make_evaluator, play_games, search_budgets, search_settings
from app.games.train.selfplay_pool import WorkerPool

__all__ = ["SelfplayError", "SelfplaySummary", "run_selfplay", "play_games", "make_evaluator",
           "search_budgets", "search_settings"]

log = get_logger(__name__)


class SelfplayError(RuntimeError):
    """A self-play worker failed; carries the worker's traceback text."""


@dataclass(frozen=True)
class SelfplaySummary:
    games: int
    positions: int
    seconds: float
    first_player_wins: int
    second_player_wins: int
    draws: int
    model_sha256: str | None
    db_path: str
    stopped: bool = False  # ended early by should_stop

    @property
    def games_per_second(self) -> float:
        return self.games / self.seconds if self.seconds > 0 else 0.0

    @property
    def positions_per_second(self) -> float:
        return self.positions / self.seconds if self.seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {**asdict(self), "games_per_second": round(self.games_per_second, 3),
                "positions_per_second": round(self.positions_per_second, 3)}


def run_selfplay(
    games: int,
    simulations: int,
    db_path: str | Path,
    model_path: str | Path | None = None,
    workers: int = 1,
    seed: int | None = None,
    node_id: str = "",
    settings: Settings | None = None,
    progress: Callable[[int], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    pool: WorkerPool | None = None,
    active_workers: int | None = None,
) -> SelfplaySummary:
    """Play `games` games into the ReplayDB at `db_path`; see the module docstring. With a
    `pool` (of `workers` processes) the workers are reused instead of spawned for this call.
    `active_workers` (default: all) of them play, the rest idle: a node gives self-play its
    spare core only while no other stage needs it (state.selfplay_workers)."""
    if games < 0 or simulations < 1 or workers < 0:
        raise ValueError(f"need games >= 0, simulations >= 1, workers >= 0; got {games}, {simulations}, {workers}")
    active = max(1, workers) if active_workers is None else active_workers
    if not 1 <= active <= max(1, workers):
        raise ValueError(f"active_workers must be 1..{max(1, workers)}, got {active_workers}")
    if pool is not None and workers and pool.size != workers:
        raise ValueError(f"a pool of {pool.size} workers for workers={workers}")
    settings = settings or Settings()
    model_sha256 = None
    if model_path is not None:
        if not Path(model_path).is_file():
            raise ModelFormatError(f"{model_path}: model file not found")
        model_sha256 = read_meta(model_path).sha256  # fail fast, before any process starts
    seeds = np.random.SeedSequence(seed).spawn(max(1, workers))
    shares = _split(games, active) + [0] * (max(1, workers) - active)
    db = ReplayDB(db_path)
    tally = _Tally()
    start = time.perf_counter()
    stopped = False
    try:
        def store(record: GameRecord) -> None:
            if db.add_game(record):
                tally.add(record)
            if progress is not None:
                progress(tally.games)

        if workers == 0:
            evaluator = make_evaluator(model_path, model_sha256, settings)
            rng = np.random.default_rng(seeds[0])
            for record in play_games(games, evaluator, settings, simulations, rng, model_sha256,
                                     node_id, {"worker": 0}, should_stop):
                store(record)
            stopped = tally.games < games
        else:
            own_pool = pool is None
            pool = pool or WorkerPool(workers)
            try:
                stopped, errors = pool.play(shares, seeds, simulations, None if model_path is None else str(model_path),
                                            model_sha256, node_id, settings, store, should_stop)
            finally:
                if own_pool:
                    pool.close()
            if errors:
                raise SelfplayError("; ".join(errors))
    finally:
        db.close()
    seconds = time.perf_counter() - start
    summary = SelfplaySummary(
        games=tally.games, positions=tally.positions, seconds=seconds,
        first_player_wins=tally.wins[0], second_player_wins=tally.wins[1], draws=tally.draws,
        model_sha256=model_sha256, db_path=str(db_path), stopped=stopped,
    )
    log.debug("selfplay_done", **summary.to_json())  # every batch, every few seconds: detail, not news
    return summary


class _Tally:
    def __init__(self) -> None:
        self.games = 0
        self.positions = 0
        self.wins: Counter[int] = Counter()  # by seat: a game may have more than two (mnk3)
        self.draws = 0

    def add(self, record: GameRecord) -> None:
        self.games += 1
        # searched positions: a random opening's moves cost no search (selfplay.random_opening_plies)
        self.positions += len(record.moves) - int(record.search.get("opening_plies", 0))
        if record.winner is None:
            self.draws += 1
        else:
            self.wins[record.winner] += 1


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]
