"""How one self-play process plays its games: the loop both the pool's workers and an
in-process run (`workers=0`) use.

It lives apart from `selfplay` so the pool's worker can import it without importing the
module that owns the pool (`selfplay` -> `selfplay_pool` -> `selfplay_games`, downward only).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from app.games.search.evaluators import Evaluator, NetworkEvaluator, UniformEvaluator
from app.games.search.mcts import SearchForest, choose_action, temperature_for_ply
from app.config import Settings
from app.db.replay_db import GameRecord, MoveRecord
from app.games import Game, GameState, get_game


def search_settings(settings: Settings, simulations: int, evaluator: str) -> dict:
    """What GameRecord.search records: enough to know how a game's targets were made."""
    s = settings.search
    recorded = {
        "simulations": simulations, "c_puct": s.c_puct, "dirichlet_alpha": s.dirichlet_alpha,
        "dirichlet_fraction": s.dirichlet_fraction, "temperature_moves": s.temperature_moves,
        "evaluator": evaluator,
    }
    if s.length_discount:
        recorded["length_discount"] = s.length_discount
    if settings.selfplay.full_search_prob < 1.0:
        recorded.update(full_search_prob=settings.selfplay.full_search_prob,
                        fast_simulations=settings.selfplay.fast_simulations)
    return recorded


def random_opening(game: Game, max_plies: int, rng: np.random.Generator) -> tuple[list[int], GameState]:
    """0..max_plies uniformly random moves from the empty board that do not end the game, and
    the position they reach.

    With `max_plies` 0 no random number is drawn, so self-play with the feature off is exactly
    what it was before it existed. A line that ends the game is drawn again (in the default
    game that needs 7 plies or more and a lucky line, so it is rare).
    """
    if max_plies <= 0:
        return [], game.initial_state()
    # at most half the game's longest line: a short game (tic-tac-toe's 9 plies) keeps room to
    # be played, and an opening that must end the game is never asked for
    plies = min(int(rng.integers(max_plies + 1)), game.max_plies // 2)
    while True:
        state, moves = game.initial_state(), []
        for _ in range(plies):
            legal = state.legal_moves()
            move = int(legal[rng.integers(len(legal))])
            state = state.play(move)
            moves.append(move)
            if state.is_terminal:
                break
        if not state.is_terminal:
            return moves, state


def search_budgets(n: int, simulations: int, full_search_prob: float, fast_simulations: int,
                   rng: np.random.Generator) -> tuple[list[int], list[bool]]:
    """Playout-cap randomisation: (simulations, is full search) for each of `n` moves.

    A full search has `simulations` and root noise and is a training sample; a fast one has
    `fast_simulations`, no noise, and only plays the move (KataGo: many cheap moves make more
    games per second, and the few full searches keep the policy targets sharp). With
    `full_search_prob` 1 every move is full and no random number is drawn, so self-play with
    the feature off is exactly what it was before it existed.
    """
    if full_search_prob >= 1.0:
        return [simulations] * n, [True] * n
    full = (rng.random(n) < full_search_prob).tolist()
    return [simulations if f else min(fast_simulations, simulations) for f in full], full


def play_games(
    n_games: int,
    evaluator: Evaluator,
    settings: Settings,
    simulations: int,
    rng: np.random.Generator,
    model_sha256: str | None = None,
    node_id: str = "",
    config: dict | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> Iterator[GameRecord]:
    """Play `n_games` self-play games, `concurrent_games` at a time; yield each as it ends."""
    game = get_game(settings.node.game)
    concurrent = max(1, min(settings.selfplay.concurrent_games, n_games))
    search = search_settings(settings, simulations, "uniform" if model_sha256 is None else "network")
    config = dict(config or {}, concurrent_games=concurrent)
    started = 0
    slots: list[_Slot] = []

    forest = SearchForest.for_search(game, settings.search, trees=concurrent)  # every game's tree, one set of arrays

    def new_slot() -> _Slot:
        nonlocal started
        started += 1
        opening, state = random_opening(game, settings.selfplay.random_opening_plies, rng)
        # recorded so the game replays; one-hot visits, never a training target (export skips them)
        moves = [MoveRecord(move, np.eye(game.num_actions, dtype=np.float32)[move].tolist(), 0.0) for move in opening]
        return _Slot(forest.add(state), moves, time.time(), opening_plies=len(opening))

    slots = [new_slot() for _ in range(concurrent)]
    while slots:
        if should_stop is not None and should_stop():
            return
        budgets, full = search_budgets(len(slots), simulations, settings.selfplay.full_search_prob,
                                       settings.selfplay.fast_simulations, rng)
        results = forest.search([s.tree for s in slots], evaluator, budgets, settings.search, rng, add_noise=full)
        still: list[_Slot] = []
        for slot, result, is_full in zip(slots, results, full):
            ply = len(slot.moves)
            if not is_full:
                slot.fast_plies.append(ply)
            action = choose_action(result.visits, temperature_for_ply(ply, settings.search.temperature_moves), rng)
            slot.moves.append(MoveRecord(action, result.visits.astype(np.float32).tolist(), result.root_value))
            forest.advance(slot.tree, action)
            final = forest.root_state(slot.tree)
            if not final.is_terminal:
                still.append(slot)
                continue
            forest.release(slot.tree)
            # fast_plies: moves of a fast search, which export leaves out of the training data;
            # opening_plies: the random moves the game started with, also left out
            record_search = {**search, "fast_plies": slot.fast_plies} if "full_search_prob" in search else search
            if settings.selfplay.random_opening_plies:
                record_search = {**record_search, "opening_plies": slot.opening_plies}
            yield GameRecord(
                uid=uuid.uuid4().hex, game=game.name, moves=slot.moves, winner=final.winner,
                model_sha256=model_sha256, node_id=node_id, search=record_search, config=config,
                started_at=slot.started_at, finished_at=time.time(),
            )
            if started < n_games:
                still.append(new_slot())
        slots = still


@dataclass
class _Slot:
    tree: int  # the game's slot in the forest
    moves: list[MoveRecord]
    started_at: float
    fast_plies: list[int] = field(default_factory=list)
    opening_plies: int = 0


def make_evaluator(model_path, model_sha256: str | None, settings: Settings) -> Evaluator:
    """The network of `model_path` (checked against its sha256), or the uniform prior when None."""
    game = get_game(settings.node.game)
    if model_path is None:
        return UniformEvaluator(game)
    from app.games.search.model import load_model  # torch loads with the first network
    from app.shared.process_group import network_device

    net, _ = load_model(model_path, expect_game=game.name, expect_sha256=model_sha256)
    return NetworkEvaluator(net.to(network_device(settings.selfplay.device)), game)
