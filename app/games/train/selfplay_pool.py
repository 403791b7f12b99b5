"""Self-play worker processes kept alive from one batch to the next.

A worker forked from the preloaded forkserver (app/games/worker_processes.py) still loads its
network and its game's kernel before it plays (a spawned one paid ~3 CPU s more, as much as a
whole batch of small games). The self-play daemon plays batch after batch, so it keeps its
workers in a `WorkerPool` and hands each batch to them as a task; a worker reloads the network
only when the model file's sha256 changes (a promotion).

Every task carries a batch number and every message a worker sends carries it back, so
games of a batch that was stopped are never stored as part of the next one. A worker that
dies or hangs past the stop grace is killed and replaced at the next batch. Workers exit on
their own when the process that started them is gone (`parent_gone`), so a kill -9 of the
node leaves no self-play process behind.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from typing import Any, Callable

from app.games.search.network_server import NetworkServer
from app.games.worker_processes import parent_gone, worker_context
from app.config import Settings
from app.db.replay_db import GameRecord
from app.log import get_logger

log = get_logger(__name__)

_POLL_SECONDS = 0.2
_IDLE_POLL_SECONDS = 1.0
_STOP_GRACE_SECONDS = 10.0
_CLOSE_SECONDS = 5.0


class PoolClosedError(RuntimeError):
    """The pool was closed; no more batches can be played on it."""


class WorkerPool:
    """`size` worker processes that play self-play shares on request (see the module docstring).
    One batch at a time; safe to call from any one thread at a time."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a worker pool needs at least one worker, got {size}")
        self.size = size
        self._ctx = worker_context()
        self._results = self._ctx.Queue()
        self._stop = self._ctx.Event()
        self._tasks: list[Any] = [None] * size
        self._procs: list[Any] = [None] * size
        self._batch = 0
        self._closed = False
        self._lock = threading.Lock()
        self.started = 0  # worker processes started over the pool's life (a test and a metric read it)
        self.server: NetworkServer | None = None  # with selfplay.shared_network: the workers' one network

    def play(self, shares: list[int], seeds: list, simulations: int, model_path: str | None,
             model_sha256: str | None, node_id: str, settings: Settings,
             store: Callable[[GameRecord], None], should_stop: Callable[[], bool] | None) -> tuple[bool, list[str]]:
        """Play one batch: share i on worker i. (stopped early, error texts)."""
        if len(shares) != self.size:
            raise ValueError(f"{len(shares)} shares for a pool of {self.size} workers")
        with self._lock:
            if self._closed:
                raise PoolClosedError("the self-play worker pool is closed")
            self._batch += 1
            batch = self._batch
            self._stop.clear()
            settings_data = settings.model_dump(mode="json", exclude_unset=True)
            server = self._network_server(model_path, model_sha256, settings)
            active: set[int] = set()
            for i, (share, seq) in enumerate(zip(shares, seeds)):
                if share == 0:
                    continue
                self._ensure_worker(i)
                self._tasks[i].put((batch, share, seq, simulations, model_path, model_sha256, node_id, settings_data,
                                    server))
                active.add(i)
            return self._collect(batch, active, store, should_stop)

    def _network_server(self, model_path: str | None, model_sha256: str | None,
                        settings: Settings) -> tuple[str, bytes] | None:
        """With `selfplay.shared_network` and a model: the server the workers connect to
        (started once, told of a new model on a promotion); its (address, key)."""
        if not settings.selfplay.shared_network or model_path is None:
            return None
        if self.server is not None and not self.server.alive():
            log.warning("network_server_restarted", reason="the server process died")
            self.server.close()
            self.server = None
        if self.server is None:
            from app.shared.process_group import network_device  # torch: only for a network server

            device = str(network_device(settings.selfplay.device))
            self.server = NetworkServer(model_path, model_sha256, settings.node.game, device)
        else:
            self.server.load(model_path, model_sha256)
        return self.server.address, self.server.authkey

    def _collect(self, batch: int, active: set[int], store: Callable[[GameRecord], None],
                 should_stop: Callable[[], bool] | None) -> tuple[bool, list[str]]:
        errors: list[str] = []
        stopped = False
        stop_deadline: float | None = None
        while active:
            if stop_deadline is None and (errors or (should_stop is not None and should_stop())):
                stopped = not errors
                self._stop.set()  # an error stops the other workers too: the batch has failed
                stop_deadline = time.monotonic() + _STOP_GRACE_SECONDS
            try:
                got_batch, kind, worker, payload = self._results.get(timeout=_POLL_SECONDS)
            except queue.Empty:
                for i in list(active):
                    if not self._procs[i].is_alive():
                        errors.append(f"selfplay-{i} exited with code {self._procs[i].exitcode}")
                        active.discard(i)
                if stop_deadline is not None and time.monotonic() > stop_deadline:
                    for i in active:
                        log.warning("selfplay_worker_killed", worker=i, reason="did not stop within the grace")
                        self._kill(i)
                    active.clear()
                continue
            if got_batch != batch:
                continue  # a stopped batch's late game: not part of this one
            if kind == "game":
                store(GameRecord.from_json(payload))
            elif kind == "done":
                active.discard(worker)
            elif kind == "error":
                errors.append(f"worker {worker}: {payload}")
                active.discard(worker)
        self._stop.clear()
        return stopped, errors

    def _ensure_worker(self, i: int) -> None:
        if self._closed:
            raise PoolClosedError("the self-play worker pool is closed")
        proc = self._procs[i]
        if proc is not None and proc.is_alive():
            return
        if proc is not None:
            proc.join(0)
        self._tasks[i] = self._ctx.Queue()
        proc = self._ctx.Process(target=_pool_worker_main, name=f"selfplay-{i}", daemon=True,
                                 args=(i, self._tasks[i], self._results, self._stop))
        proc.start()
        self._procs[i] = proc
        self.started += 1

    def _kill(self, i: int) -> None:
        proc = self._procs[i]
        if proc is not None and proc.is_alive():
            proc.kill()
            proc.join(_CLOSE_SECONDS)

    def close(self) -> None:
        """Ask every worker to exit, kill those that do not within a few seconds. Idempotent.
        Takes no lock: a batch still running in another thread sees its workers gone and returns."""
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        for task_queue, proc in zip(self._tasks, self._procs):
            if proc is not None and proc.is_alive():
                task_queue.put(None)
        deadline = time.monotonic() + _CLOSE_SECONDS
        for i, proc in enumerate(self._procs):
            if proc is not None:
                proc.join(max(0.0, deadline - time.monotonic()))
                self._kill(i)
        if self.server is not None:
            self.server.close()


def _pool_worker_main(worker: int, tasks, results, stop) -> None:
    """Entry point of a pool worker: one torch thread; tasks in, games out, until told to exit
    or orphaned."""
    import numpy as np
    import torch

    from app.games.search.network_server import SharedNetworkClient
    from app.games.train.selfplay_games import make_evaluator, play_games

    torch.set_num_threads(1)
    cached: tuple[tuple, Any] | None = None  # ((model path, sha256, game), evaluator)

    while not parent_gone():
        try:
            task = tasks.get(timeout=_IDLE_POLL_SECONDS)
        except queue.Empty:
            continue
        if task is None:
            return
        batch, n_games, seed_seq, simulations, model_path, model_sha256, node_id, settings_data, server = task
        client = None
        try:
            settings = Settings.model_validate(settings_data)
            if server is not None:  # the node's one network process evaluates every worker's leaves
                evaluator = client = SharedNetworkClient.connect(*server, settings.node.game, f"selfplay-{worker}")
            else:
                key = (model_path, model_sha256, settings.node.game, settings.model.channels, settings.model.blocks)
                if cached is None or cached[0] != key:
                    cached = (key, make_evaluator(model_path, model_sha256, settings))
                evaluator = cached[1]
            rng = np.random.default_rng(seed_seq)

            def should_stop() -> bool:
                return stop.is_set() or parent_gone()

            config = {"worker": worker, "seed_entropy": str(seed_seq.entropy)}
            for record in play_games(n_games, evaluator, settings, simulations, rng, model_sha256,
                                     node_id, config, should_stop):
                results.put((batch, "game", worker, record.to_json()))
                if should_stop():
                    break
            results.put((batch, "done", worker, None))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            results.put((batch, "error", worker, traceback.format_exc()))
        finally:
            if client is not None:
                client.close()
    results.cancel_join_thread()  # nobody reads the queue any more: do not hang on a full pipe
