"""Synthetic replay games for the export and training tests (not a test module).

Games are played by a biased random policy (centre columns preferred) and store a visit
distribution that leans to the move played, so a network has something learnable and the
loss visibly falls within a few dozen steps.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np

from app.db.replay_db import GameRecord, MoveRecord, ReplayDB
from app.games import get_game

CENTRE_BIAS = np.array([1, 2, 4, 8, 4, 2, 1], dtype=np.float64)


def synthetic_game(uid: str, rng: np.random.Generator, finished_at: float) -> GameRecord:
    game = get_game("connect4")
    state = game.initial_state()
    moves: list[MoveRecord] = []
    while not state.is_terminal:
        legal = state.legal_mask()
        weights = CENTRE_BIAS * legal
        probs = weights / weights.sum()
        action = int(rng.choice(game.num_actions, p=probs))
        visits = 0.5 * probs
        visits[action] += 0.5
        moves.append(MoveRecord(action, visits.astype(np.float32).tolist(), 0.0))
        state = state.play(action)
    return GameRecord(uid=uid, game="connect4", moves=moves, winner=state.winner,
                      node_id="test", started_at=finished_at - 1.0, finished_at=finished_at)


def make_db(path: Path, count: int, prefix: str = "g", seed: int = 0, start: int = 0) -> list[GameRecord]:
    rng = np.random.default_rng(seed)
    records = [synthetic_game(f"{prefix}-{i}", rng, 1_000_000.0 + i) for i in range(start, start + count)]
    with ReplayDB(path) as db:
        db.add_games(records)
    return records


def live_pids_with_marker(marker: str) -> list[int]:
    """Processes (of any parent) whose command line or environment contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read()
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and (marker.encode() in cmd or marker.encode() in env):
            found.append(int(entry))
    return found


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
