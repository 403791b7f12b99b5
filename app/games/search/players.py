"""Players a gauntlet pits a candidate against: random, heuristic, rollout MCTS, network MCTS.

Each player answers `select_move(state) -> action` for whatever position it is handed, so a
match driver needs nothing but the game interface; `reset()` drops per-game memory (a
reused search tree). `select_moves(states, games)` answers many games' positions at once:
the search players advance one tree per game in lock step, so each network call evaluates
a leaf of every game (a batch of one costs ~2.7x more per position on a CPU core, far more
on a GPU); `games` names each position's game, whose tree is kept for its next move. A
`PlayerSpec` is the picklable description a worker process turns into a player, and its
`name` is the player's identity in recorded games and ratings: two players with the same
name must be the same strength (so names carry depth / simulations).
"""

from __future__ import annotations

from pathlib import Path
from typing import Hashable, Protocol, Sequence

import numpy as np

from app.games.search.evaluators import NetworkEvaluator, RolloutEvaluator
from app.games.search.heuristic import heuristic_move
from app.games.search.mcts import SearchForest
from app.games.search.player_specs import (  # noqa: F401 - the specs' names, as this module always offered them
    RANDOM_NAME, PlayerSpec, PlayerSpecError, model_player_name, model_sha_of_player, net_spec, parse_player_spec,
)
from app.config.pipeline import SearchConfig
from app.games import DEFAULT_GAME, GameState, get_game


class Player(Protocol):
    name: str

    def select_move(self, state: GameState) -> int: ...

    def select_moves(self, states: Sequence[GameState], games: Sequence[Hashable]) -> list[int]: ...

    def reset(self) -> None: ...


class _OneAtATime:
    """`select_moves` for players with nothing to batch: one `select_move` per position."""

    def select_moves(self, states: Sequence[GameState], games: Sequence[Hashable]) -> list[int]:
        return [self.select_move(state) for state in states]  # type: ignore[attr-defined]


class RandomPlayer(_OneAtATime):
    """Uniform over legal moves: the rating anchor (Elo 0)."""

    name = RANDOM_NAME

    def __init__(self, rng: np.random.Generator | None = None) -> None:
        self.rng = rng if rng is not None else np.random.default_rng()

    def select_move(self, state: GameState) -> int:
        moves = state.legal_moves()
        return int(moves[int(self.rng.integers(len(moves)))])

    def reset(self) -> None:
        pass


class HeuristicPlayer(_OneAtATime):
    """Wins when it can, blocks an immediate loss, else shallow negamax preferring the centre."""

    def __init__(self, depth: int = 2, rng: np.random.Generator | None = None, game_name: str = DEFAULT_GAME) -> None:
        if depth < 1:
            raise ValueError(f"heuristic depth must be >= 1, got {depth}")
        self.depth = depth
        self.game_name = game_name
        self.rng = rng if rng is not None else np.random.default_rng()
        self.name = f"heuristic-d{depth}"

    def select_move(self, state: GameState) -> int:
        return heuristic_move(state, self.depth, self.rng, self.game_name)

    def reset(self) -> None:
        pass


class _TreePlayer:
    """Shared by the MCTS players: one tree per game, all of them in one forest (one set of
    arrays), each reused across the player's own consecutive moves in its game; `select_move`
    plays the game named None."""

    def __init__(self, evaluator, simulations: int, search_cfg: SearchConfig, rng: np.random.Generator) -> None:
        self.evaluator = evaluator
        self.simulations = simulations
        self.search_cfg = search_cfg
        self.rng = rng
        self.forest = SearchForest.for_search(evaluator.game, search_cfg)
        self.trees: dict[Hashable, int] = {}  # game -> its slot in the forest

    @property
    def tree(self) -> int | None:
        """The slot of the game `select_move` plays."""
        return self.trees.get(None)

    def reset(self) -> None:
        for slot in self.trees.values():
            self.forest.release(slot)
        self.trees = {}

    def _tree_for(self, state: GameState, game: Hashable) -> int:
        """The game's tree advanced to `state` when it is at most two plies below its root,
        else a new one."""
        slot = self.trees.get(game)
        if slot is None:
            slot = self.trees[game] = self.forest.add(state)
            return slot
        root = self.forest.root_state(slot)
        target = state.key()
        if root.key() == target and root.ply == state.ply:
            return slot
        if state.ply - root.ply in (1, 2):
            for a in root.legal_moves():
                child = root.play(a)
                if state.ply == child.ply:
                    if child.key() == target:
                        self.forest.advance(slot, a)
                        return slot
                    continue
                for b in child.legal_moves():
                    if child.play(b).key() == target:
                        self.forest.advance(slot, a)
                        self.forest.advance(slot, b)
                        return slot
        self.forest.reset(slot, state)
        return slot

    def select_move(self, state: GameState) -> int:
        return self.select_moves([state], [None])[0]

    def select_moves(self, states: Sequence[GameState], games: Sequence[Hashable]) -> list[int]:
        if len(set(games)) != len(games):
            raise ValueError("select_moves: each position must belong to a different game")
        slots = [self._tree_for(state, g) for state, g in zip(states, games)]
        results = self.forest.search(slots, self.evaluator, max(self.simulations, 1), self.search_cfg, self.rng)
        actions = []
        for slot, result in zip(slots, results):
            action = result.best_action
            self.forest.advance(slot, action)
            actions.append(action)
        return actions


class RolloutMCTSPlayer(_TreePlayer):
    """Plain MCTS: uniform priors, leaves valued by random playouts. Knows nothing learnt."""

    def __init__(self, game_name: str = DEFAULT_GAME, simulations: int = 200, rollouts_per_leaf: int = 4,
                 search_cfg: SearchConfig | None = None, rng: np.random.Generator | None = None) -> None:
        rng = rng if rng is not None else np.random.default_rng()
        evaluator = RolloutEvaluator(get_game(game_name), rollouts_per_leaf, rng)
        super().__init__(evaluator, simulations, search_cfg or SearchConfig(), rng)
        self.name = f"rollout-s{simulations}"


class NetMCTSPlayer(_TreePlayer):
    """A trained network with PUCT search, no noise, most-visited move; `simulations == 0`
    plays the raw policy's argmax."""

    def __init__(self, model_path: str | Path, simulations: int = 64, search_cfg: SearchConfig | None = None,
                 expect_sha256: str | None = None, rng: np.random.Generator | None = None,
                 device: str = "cpu") -> None:
        from app.games.search.model import load_model  # torch loads with the first network player

        net, meta = load_model(model_path, expect_sha256=expect_sha256)
        net = net.to(device)
        super().__init__(NetworkEvaluator(net, get_game(meta.game)), simulations, search_cfg or SearchConfig(),
                         rng if rng is not None else np.random.default_rng())
        self.meta = meta
        self.sha256 = str(meta.sha256)
        self.name = model_player_name(self.sha256, simulations)

    def select_moves(self, states: Sequence[GameState], games: Sequence[Hashable]) -> list[int]:
        if self.simulations > 0:
            return super().select_moves(states, games)
        priors, _ = self.evaluator.evaluate(list(states))
        return [int(np.argmax(row)) for row in priors]


def make_player(spec: PlayerSpec, seed: int | None = None) -> Player:
    """Build the player a spec describes, with its own random stream."""
    rng = np.random.default_rng(seed)
    search_cfg = SearchConfig(c_puct=spec.c_puct)
    if spec.kind == "random":
        return RandomPlayer(rng)
    if spec.kind == "heuristic":
        return HeuristicPlayer(spec.depth, rng, spec.game)
    if spec.kind == "rollout":
        return RolloutMCTSPlayer(spec.game, spec.simulations, search_cfg=search_cfg, rng=rng)
    if spec.kind == "net":
        if spec.model_path is None:
            raise PlayerSpecError("a net player needs a model path")
        return NetMCTSPlayer(spec.model_path, spec.simulations, search_cfg, expect_sha256=spec.sha256, rng=rng,
                             device=spec.device)
    raise PlayerSpecError(f"unknown player kind {spec.kind!r}")
