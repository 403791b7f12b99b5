"""The self-play worker pool: real spawn processes reused from batch to batch, a promotion's
model picked up, a stopped batch's late games never stored with the next, a dead worker
replaced, and no process left after close."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import Settings
from app.db.replay_db import ReplayDB
from app.games import get_game
from app.games.train.selfplay import SelfplayError, run_selfplay
from app.games.train.selfplay_pool import PoolClosedError, WorkerPool
from tests.orchestrator_helpers import wait_until

SETTINGS = Settings.model_validate({"model": {"channels": 8, "blocks": 1}, "selfplay": {"concurrent_games": 4}})


def tiny_model(tmp_path: Path) -> tuple[Path, str]:
    game = get_game("connect4")
    arch = Architecture(8, 1, game.plane_shape, game.num_actions)
    path = tmp_path / "best.safetensors"
    meta = save_model(new_model(arch, seed=3), ModelMeta(arch, game.name), path)
    return path, meta.sha256


def stored(db_path: Path) -> list[tuple[str, str | None]]:
    with ReplayDB(db_path) as db:
        return [(g.uid, g.model_sha256) for g in db.iter_games()]


@pytest.mark.timeout(180)
def test_batches_reuse_the_workers_and_pick_up_a_new_model(tmp_path: Path) -> None:
    db = tmp_path / "games.db"
    model, sha = tiny_model(tmp_path)
    pool = WorkerPool(2)
    try:
        first = run_selfplay(games=6, simulations=4, db_path=db, workers=2, seed=1, node_id="n", settings=SETTINGS, pool=pool)
        pids = [p.pid for p in pool._procs]
        second = run_selfplay(games=6, simulations=4, db_path=db, workers=2, seed=2, node_id="n", settings=SETTINGS,
                              pool=pool, model_path=model)
        assert (first.games, second.games) == (6, 6)
        assert pool.started == 2 and [p.pid for p in pool._procs] == pids, "the second batch spawned workers"
        games = stored(db)
        assert len(games) == 12 and len({uid for uid, _ in games}) == 12
        assert sorted(s or "" for _, s in games) == [""] * 6 + [sha] * 6  # the promoted model played the second batch
    finally:
        pool.close()
    assert all(not p.is_alive() for p in pool._procs)
    with pytest.raises(PoolClosedError):
        pool.play([1, 1], [None, None], 4, None, None, "n", SETTINGS, lambda record: None, None)


@pytest.mark.timeout(180)
def test_a_stopped_batch_stores_what_it_reported_and_nothing_leaks_into_the_next(tmp_path: Path) -> None:
    db = tmp_path / "games.db"
    pool = WorkerPool(1)
    stop = threading.Event()
    try:
        # Stopped after its first stored game: the worker still plays on a little, and those
        # late games must be dropped, not stored as part of the next batch.
        stopped = run_selfplay(games=400, simulations=4, db_path=db, workers=1, seed=1, node_id="n", settings=SETTINGS,
                               pool=pool, progress=lambda done: stop.set(), should_stop=stop.is_set)
        assert stopped.stopped and 1 <= stopped.games < 400
        assert len(stored(db)) == stopped.games
        after = run_selfplay(games=5, simulations=4, db_path=db, workers=1, seed=2, node_id="n", settings=SETTINGS, pool=pool)
        assert after.games == 5 and not after.stopped
        assert len(stored(db)) == stopped.games + 5, "a stopped batch's game was stored with the next batch"
    finally:
        pool.close()


@pytest.mark.timeout(180)
def test_a_killed_worker_fails_its_batch_and_is_replaced_for_the_next(tmp_path: Path) -> None:
    db = tmp_path / "games.db"
    pool = WorkerPool(1)
    try:
        run_selfplay(games=2, simulations=4, db_path=db, workers=1, seed=1, node_id="n", settings=SETTINGS, pool=pool)
        victim = pool._procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        wait_until(lambda: not victim.is_alive(), 30, what="the killed worker gone")
        # Between batches: the next batch starts a new worker and plays in full.
        replaced = run_selfplay(games=3, simulations=4, db_path=db, workers=1, seed=2, node_id="n",
                                settings=SETTINGS, pool=pool)
        assert replaced.games == 3 and pool.started == 2
        # Mid-batch: the batch fails with the worker's exit code named.
        def kill_on_first_game(done: int) -> None:
            if done == 1:
                os.kill(pool._procs[0].pid, signal.SIGKILL)

        with pytest.raises(SelfplayError, match="selfplay-0 exited with code -9"):
            run_selfplay(games=400, simulations=4, db_path=db, workers=1, seed=3, node_id="n",
                         settings=SETTINGS, pool=pool, progress=kill_on_first_game)
    finally:
        pool.close()


@pytest.mark.timeout(180)
def test_a_batch_on_part_of_the_pool_leaves_the_other_workers_unstarted(tmp_path: Path) -> None:
    """A lone node collecting games plays on both cores, but the batch before training on one:
    the idle worker must not be started, nor be handed games it would play beside the trainer."""
    db = tmp_path / "games.db"
    pool = WorkerPool(2)
    try:
        one = run_selfplay(games=5, simulations=4, db_path=db, workers=2, seed=1, node_id="n", settings=SETTINGS,
                           pool=pool, active_workers=1)
        assert one.games == 5 and pool.started == 1 and pool._procs[1] is None
        both = run_selfplay(games=5, simulations=4, db_path=db, workers=2, seed=2, node_id="n", settings=SETTINGS,
                            pool=pool, active_workers=2)
        assert both.games == 5 and pool.started == 2
        assert len(stored(db)) == 10
        with pytest.raises(ValueError, match="active_workers must be 1..2, got 3"):
            run_selfplay(games=1, simulations=4, db_path=db, workers=2, settings=SETTINGS, pool=pool, active_workers=3)
    finally:
        pool.close()


def test_a_pool_of_another_size_is_refused(tmp_path: Path) -> None:
    pool = WorkerPool(2)
    with pytest.raises(ValueError, match="pool of 2 workers for workers=1"):
        run_selfplay(games=1, simulations=4, db_path=tmp_path / "g.db", workers=1, settings=SETTINGS, pool=pool)
    pool.close()
