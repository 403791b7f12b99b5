"""A game's search is compiled by one process under a file lock; a process that finds the lock
held waits for it, then finds the kernel compiled (app/games/search/kernel_warm.py)."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from app.games import get_game
from app.games.search.kernel_build import kernel_for
from app.games.search import kernel_warm
from app.games.search.kernel_warm import ensure_compiled
from app.games.search.search_forest import tiny_search


def test_a_process_that_finds_the_lock_held_waits_and_then_finds_the_kernel_compiled() -> None:
    game = get_game("connect4")
    kernel_file = kernel_for(game).__file__
    ensure_compiled(kernel_file, lambda: tiny_search(game))  # compiled (or loaded) once, so the wait below is cheap
    marker = Path(kernel_file).with_suffix(".compiled")
    assert marker.exists()
    marker.unlink()  # as on a machine where no process compiled this kernel yet,
    kernel_warm._SEEN.discard(kernel_file)  # and in a process that has not looked at it

    with open(marker.with_suffix(".lock"), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # another process is compiling
        waiter = threading.Thread(target=ensure_compiled, args=(kernel_file, lambda: tiny_search(game)), daemon=True)
        waiter.start()
        waiter.join(timeout=1.0)
        assert waiter.is_alive(), "ensure_compiled did not wait for the lock"
        assert not marker.exists()
    waiter.join(timeout=120)  # the lock is free: it runs its tiny search and leaves the marker
    assert not waiter.is_alive() and marker.exists()


def test_a_compiled_kernel_is_not_searched_again() -> None:
    game = get_game("connect4")
    kernel_file = kernel_for(game).__file__
    ensure_compiled(kernel_file, lambda: tiny_search(game))
    kernel_warm._SEEN.discard(kernel_file)  # a process that has not looked at it: it finds the marker
    lock = Path(kernel_file).with_suffix(".lock")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        done = threading.Thread(target=ensure_compiled, args=(kernel_file, lambda: tiny_search(game)), daemon=True)
        done.start()
        done.join(timeout=30)  # the marker is there: no lock taken, back at once
        assert not done.is_alive()
