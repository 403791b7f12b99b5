"""One process compiles a game's search; the others that start beside it wait and load it.

numba compiles each function of a kernel at its first call and caches it beside the kernel's
file (app/games/search/kernel_build.py): about 9 CPU s for a game's whole search on a fresh
machine, against 0.5 s to load it cached. Processes that start together (a node's self-play
workers, a cluster's nodes on one machine, a test suite's nodes) each found the cache empty
and compiled the same functions at once, so a fresh machine paid it once per process. So a
game's first search on the machine is a tiny one, run under a file lock beside the kernel's
file; a marker file says it is done, and a process that waited on the lock finds the marker
and loads what the first one compiled.

A function the tiny search (`search_forest.tiny_search`) does not reach is compiled by whichever process calls it first,
as before: the lock only takes the bulk of the work off the processes that wait.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable
from pathlib import Path

_SEEN: set[str] = set()  # kernels this process found compiled, compiled, or is compiling now


def ensure_compiled(kernel_file: str, tiny_search: Callable[[], None]) -> None:
    """Return once the kernel at `kernel_file` is compiled into numba's cache: by `tiny_search`
    (a search that calls its functions) in this process, or by another that held the lock.
    Each kernel is looked at once a process: a forest is made per search of one position too."""
    if kernel_file in _SEEN:  # also the tiny search's own forest, while it runs
        return
    _SEEN.add(kernel_file)
    marker = Path(kernel_file).with_suffix(".compiled")
    if marker.exists():
        return
    try:
        with open(marker.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, and if this process dies
            if not marker.exists():
                tiny_search()
                marker.touch()
    except BaseException:
        _SEEN.discard(kernel_file)  # not compiled: the next forest tries again
        raise
