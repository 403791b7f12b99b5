"""How a gauntlet's games are played: openings, the games of a match cut into waves, and each
wave played in lock step by one worker (a forked worker process, one torch thread; or this process).

Each group of games (one per seat: a pair for two players) starts from its own random opening
of a few plies and the candidate takes each seat once, the opponent every other seat. A worker plays its wave's games together: each round every game's side to
move moves, and a player moves in all of its games at once (`Player.select_moves`), so a
search player's network call carries a leaf of every game still running instead of one
position (`scripts/bench_gauntlet.py`: 4.45x on a 20-game match on one CPU core).
`app/games/train/gauntlet.py` decides what is played and counts the results.
"""

from __future__ import annotations

import math
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from app.games.search.players import PlayerSpec, make_player
from app.config import Settings
from app.db.seat_pairs import Seat, seat_scores
from app.games import Game, get_game
from app.games.worker_processes import worker_context

# Most games one worker plays at once. One CPU core evaluates the 48x4 net at ~1,300
# positions/s one at a time, ~2,600 in batches of 16 and ~3,600 in batches of 64; each side of
# a wave moves in half its games, so 32 games make batches of ~16. The cap bounds a wave's
# trees in memory and the games a match plays past an SPRT decision.
MAX_WAVE = 32


@dataclass(frozen=True)
class GameTask:
    index: int
    candidate: PlayerSpec
    opponent: PlayerSpec
    candidate_side: int  # the candidate's seat (0: it moves first after the opening)
    opening: tuple[int, ...]
    seed: int


@dataclass(frozen=True)
class GameOutcome:
    index: int
    candidate_side: int
    winner: int | None
    moves: str
    opening_plies: int
    seats: int = 2
    returns: tuple[float, ...] = ()  # N > 2 seats: each seat's return, in seat order

    def pair_scores(self) -> list[float]:
        """The candidate's results a tally counts: two seats, one (1 a win, 0.5 a draw, 0 a
        loss); N > 2 seats, one against each other seat (app/db/seat_pairs.py), so between
        equal players the share is 0.5 whatever N is."""
        if self.returns:
            return seat_scores(self.returns, self.candidate_side)
        return [0.5 if self.winner is None else (1.0 if self.winner == self.candidate_side else 0.0)]

    @property
    def candidate_score(self) -> float:
        """The mean of `pair_scores`: this game's score for the candidate."""
        scores = self.pair_scores()
        return sum(scores) / len(scores)

    def record(self, candidate: str, opponent: str) -> tuple[str, str, int | None, tuple[Seat, ...]]:
        """(player0, player1, winner, seats) as the registry keeps a game: seats in order for
        two players; with more, each seat's (player, return) and, for readers of two seats
        only, the candidate as player0 against the field (winner 0 when the candidate alone
        came first, 1 when an opponent's seat did, None otherwise)."""
        if not self.returns:
            p0, p1 = (candidate, opponent) if self.candidate_side == 0 else (opponent, candidate)
            return p0, p1, self.winner, ()
        winner = None if self.winner is None else (0 if self.winner == self.candidate_side else 1)
        seats = tuple((candidate if s == self.candidate_side else opponent, r) for s, r in enumerate(self.returns))
        return candidate, opponent, winner, seats


# --- openings and waves of games (run inside workers) -----------------------------------


def make_openings(game: Game, count: int, min_plies: int, max_plies: int, rng: np.random.Generator) -> list[tuple[int, ...]]:
    """`count` distinct random openings of min..max plies that leave the game undecided.

    Distinct while the game has enough of them; after that, repeats rather than fail.
    """
    if not 0 <= min_plies <= max_plies:
        raise ValueError(f"opening plies must satisfy 0 <= min <= max, got {min_plies}..{max_plies}")
    seen: set[tuple[int, ...]] = set()
    out: list[tuple[int, ...]] = []
    for _ in range(count):
        for attempt in range(200):
            moves: list[int] = []
            state = game.initial_state()
            for _ in range(int(rng.integers(min_plies, max_plies + 1))):
                legal = state.legal_moves()
                if not legal:
                    break
                action = int(legal[int(rng.integers(len(legal)))])
                moves.append(action)
                state = state.play(action)
            opening = tuple(moves)
            if state.is_terminal:
                continue
            if opening not in seen or attempt == 199:
                break
        seen.add(opening)
        out.append(opening)
    return out


def play_games(game: Game, candidate, opponent, tasks: Sequence[GameTask],
               should_stop: Callable[[], bool] | None = None) -> list[GameOutcome]:
    """Play a wave of games in lock step: each round, every game's side to move moves, and a
    player moves in all of its games at once (`select_moves`), so a search player's network
    sees one batch per simulation for the whole wave instead of one position. `should_stop`
    is asked between rounds; when it says stop, only the games already finished come back."""
    states = []
    for task in tasks:
        state = game.initial_state()
        for action in task.opening:
            state = state.play(action)
        states.append(state)
    candidate.reset()
    opponent.reset()
    while not (should_stop is not None and should_stop()):
        moved = False
        for player, is_candidate in ((candidate, True), (opponent, False)):
            turn = [i for i, (task, state) in enumerate(zip(tasks, states))
                    if not state.is_terminal and (state.to_move == task.candidate_side) == is_candidate]
            if not turn:
                continue
            moves = player.select_moves([states[i] for i in turn], turn)
            for i, move in zip(turn, moves):
                states[i] = states[i].play(move)
            moved = True
        if not moved:
            break
    return [_outcome(task, state, game.num_players) for task, state in zip(tasks, states) if state.is_terminal]


def _outcome(task: GameTask, state, seats: int) -> GameOutcome:
    returns = tuple(float(r) for r in state.returns()) if seats > 2 else ()
    return GameOutcome(task.index, task.candidate_side, state.winner, state.to_text(), len(task.opening), seats, returns)


_PLAYER_CACHE: dict[PlayerSpec, object] = {}


def _cached_player(spec: PlayerSpec, seed: int):
    """A network player lives as long as its worker (its network is loaded once, not once
    per wave) but takes the wave's seed each time, so a wave's games depend on its task and
    not on which waves this worker played before; the other players are cheap to build and
    are built anew."""
    if spec.kind != "net":
        return make_player(spec, seed)
    player = _PLAYER_CACHE.get(spec)
    if player is None:
        player = _PLAYER_CACHE[spec] = make_player(spec, seed)
    else:
        player.rng = np.random.default_rng(seed)
    return player


def run_wave(tasks: tuple[GameTask, ...], should_stop: Callable[[], bool] | None = None) -> list[GameOutcome]:
    """One worker's share of a match: a wave of games between the same two players (the
    finished ones only, when `should_stop` ended it early: inline play only, since a
    spawned worker cannot be handed the caller's callback)."""
    first = tasks[0]
    game = get_game(first.candidate.game)
    candidate = _cached_player(first.candidate, first.seed)
    opponent = _cached_player(first.opponent, first.seed + 1)
    if first.candidate.name == first.opponent.name:
        opponent = make_player(first.opponent, first.seed + 1)  # self-play needs two sets of trees
    return play_games(game, candidate, opponent, tasks, should_stop)


def _worker_init() -> None:
    import torch

    torch.set_num_threads(1)


# --- tasks, waves and executors (parent process) ----------------------------------------


class InlineExecutor:
    """Runs tasks in this process when one worker is asked for: no spawn cost in tests."""

    def submit(self, fn, *args) -> Future:
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            fut.set_exception(exc)
        return fut

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        pass


def match_tasks(candidate: PlayerSpec, opponent: PlayerSpec, games: int, settings: Settings,
                rng: np.random.Generator) -> list[GameTask]:
    """A match's games in opening groups, one game per seat (pairs for two players): games
    Nk .. Nk + N-1 share an opening, after which the candidate takes seat 0, 1, .. N-1 in
    turn; each game's seed comes from `rng`."""
    cfg = settings.gauntlet
    game = get_game(candidate.game)
    seats = game.num_players
    groups = math.ceil(games / seats)
    openings = make_openings(game, groups, cfg.opening_plies_min, cfg.opening_plies_max, rng)
    tasks = []
    for i in range(groups * seats):
        tasks.append(GameTask(i, candidate, opponent, i % seats, openings[i // seats], int(rng.integers(2**31))))
    return tasks


def cut_waves(tasks: list[GameTask], workers: int) -> list[tuple[GameTask, ...]]:
    """Cut a match into waves: one per worker, each of at most MAX_WAVE games (whole pairs
    where it can), so every worker batches as many games as the match gives it while the
    sequential test still looks at the results between waves."""
    size = min(MAX_WAVE, max(1, math.ceil(len(tasks) / max(1, workers))))
    size += size % 2 if size < len(tasks) else 0
    return [tuple(tasks[i:i + size]) for i in range(0, len(tasks), size)]


def match_executor(workers: int):
    """One worker plays in this process, on one torch thread like a spawned worker: a wave's
    network calls are small batches (~16 positions), which more threads only slow (measured
    on batches of one, on 2 cores: 1271 vs 995 calls/s quiet, 1334 vs 312 beside one busy
    process: the threads spin waiting for a core). The setting is process-wide; a game
    node's orchestrator runs no other torch work."""
    if workers <= 1:
        _worker_init()
        return InlineExecutor()
    return ProcessPoolExecutor(max_workers=workers, mp_context=worker_context(), initializer=_worker_init)
