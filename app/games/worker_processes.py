"""How the game workload starts its worker processes: self-play pool workers, gauntlet match
workers and the shared network server.

A spawned worker starts a fresh interpreter and imports torch, numba and the game code, about
3 CPU seconds before its first move (as much as a batch of small games). A forkserver imports
them once (`PRELOAD`) and forks each worker from that state, ready in a fraction of a second.
The forkserver itself has run nothing (no thread, no CUDA context, no open database), so a
fork of it is as clean as a spawned process, which a fork of the node would not be.

A worker is not the node's child but the forkserver's, so it watches the process that asked
for it through multiprocessing's parent sentinel (`parent_gone`), not through its parent pid:
a kill -9 of the node still leaves no worker behind.
"""

from __future__ import annotations

import multiprocessing as mp
from multiprocessing.context import BaseContext

# What every game worker imports; the first process to start a worker starts the forkserver
# with these, so the list is the union of what the three kinds of worker run.
# The node itself loads torch only when it needs a network, so the network modules are named here.
PRELOAD = ["app.games.train.selfplay_pool", "app.games.train.selfplay_games", "app.games.search.network_server",
           "app.games.train.match_games", "app.games.search.model", "app.shared.process_group"]


def worker_context() -> BaseContext:
    """The multiprocessing context of game workers (forkserver, preloaded)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def parent_gone() -> bool:
    """True once the process that started this worker has exited (or was killed)."""
    parent = mp.parent_process()
    return parent is not None and not parent.is_alive()
