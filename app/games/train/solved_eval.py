"""How far a model is from perfect play, on positions a perfect solver scored move by move.

    positions = load_positions(default_positions_path(REPO))   # the game's Game.scored_positions
    report = score_model(net, positions, simulations=[0, 400], cfg=SearchConfig())
    report["raw"]["exact"], report["mcts"]["400"]["outcome"]

For a solved game that ships a scored set (`Game.scored_positions`: the default game's
`move_scores.txt`, format in the README beside it), the distance to perfect play can be
measured instead of guessed from Elo against weak baselines: the file gives every legal move
of 931 middle-game positions a solver score. A chosen move is *exact* when
it has the best score, and *keeps the outcome* when its score has the best score's sign
(a won position stays won, a drawn one drawn). The raw network plays the argmax of its
policy; MCTS plays the most visited move of a noise-free search, all positions' trees
searched in lock step so each evaluator call is one big batch (931 positions x 400
simulations is then minutes, not an hour, on one core).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from app.games.search.evaluators import NetworkEvaluator
from app.games.search.mcts import SearchForest
from app.config.pipeline import SearchConfig
from app.games import DEFAULT_GAME, Game, GameError, GameState, get_game

if TYPE_CHECKING:
    from app.games.search.model import PolicyValueNet

POSITIONS_NAME = "move_scores.txt"
# Ply ranges of the per-phase breakdown (the file holds plies 4-32).
PHASES: tuple[tuple[str, int, int], ...] = (("opening", 0, 12), ("middle", 13, 22), ("late", 23, 42))
# The split by the position's true result: in a won position a move that keeps the win but is
# not exact wins too slowly; in a lost one every move keeps the (lost) outcome, and a miss
# loses too early. Outcome minus exact there is what the search's win-speed ranking decides.
RESULTS: tuple[tuple[str, int], ...] = (("won", 1), ("drawn", 0), ("lost", -1))


# A move that wins on the spot, above any value the network can give (tanh: at most 1).
WIN_ON_THE_SPOT = 2.0
VALUE_BATCH = 2048  # children per forward pass of `value_choices`


class SolvedEvalError(ValueError):
    """Positions that cannot be read or do not fit the rules; the message names the path."""


@dataclass(frozen=True)
class ScoredPosition:
    """One position (Pons move string) and the solver's score of each column; None = full."""

    moves: str
    scores: tuple[int | None, ...]

    @property
    def best(self) -> int:
        return max(s for s in self.scores if s is not None)

    @property
    def ply(self) -> int:
        return len(self.moves)

    def is_exact(self, action: int) -> bool:
        return self.score_of(action) == self.best

    def keeps_outcome(self, action: int) -> bool:
        return np.sign(self.score_of(action)) == np.sign(self.best)

    def score_of(self, action: int) -> int:
        score = self.scores[action]
        if score is None:
            raise SolvedEvalError(f"position {self.moves!r}: column {action + 1} is full, not a legal choice")
        return score


def default_positions_path(repo_root: str | Path, game: Game | None = None) -> Path | None:
    """Where the game's scored set lives (`Game.scored_positions`, relative to the directory
    that holds the repository: the shared benchmarks sit beside it, not inside); None for a
    game that ships none."""
    game = game or get_game(DEFAULT_GAME)
    if game.scored_positions is None:
        return None
    return Path(repo_root).resolve().parent / game.scored_positions


def parse_line(line: str, num_actions: int = 7) -> ScoredPosition:
    """`<moves> <score col 1> ... <score col 7>`; ValueError says what is wrong."""
    fields = line.split()
    if len(fields) != num_actions + 1:
        raise ValueError(f"expected a move string and {num_actions} scores, got {len(fields)} fields")
    moves, raw = fields[0], fields[1:]
    scores = tuple(None if s == "None" else int(s) for s in raw)
    if all(s is None for s in scores):
        raise ValueError("no legal move scored")
    return ScoredPosition(moves, scores)


def load_positions(path: str | Path, game: Game | None = None) -> list[ScoredPosition]:
    """Every position of the file, each checked against the rules (its full columns and
    that it is unfinished); any problem is a SolvedEvalError naming path and line."""
    path = Path(path)
    game = game or get_game(DEFAULT_GAME)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SolvedEvalError(
            f"{path}: solved move scores not found (expected the game's scored set "
            f"../{game.scored_positions or POSITIONS_NAME} beside the repository)") from None
    except OSError as exc:
        raise SolvedEvalError(f"{path}: unreadable: {exc}") from None
    positions: list[ScoredPosition] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            position = parse_line(line, game.num_actions)
            state = game.parse(position.moves)
        except (ValueError, GameError) as exc:
            raise SolvedEvalError(f"{path}:{number}: {exc}") from None
        if state.is_terminal:
            raise SolvedEvalError(f"{path}:{number}: position {position.moves!r} is already finished")
        legal = state.legal_mask()
        if any(bool(legal[a]) != (position.scores[a] is not None) for a in range(game.num_actions)):
            raise SolvedEvalError(f"{path}:{number}: scores name other columns full than the rules do")
        positions.append(position)
    if not positions:
        raise SolvedEvalError(f"{path}: no positions")
    return positions


# ---- pure scoring ----------------------------------------------------------------------------


def accuracy(positions: Sequence[ScoredPosition], choices: Sequence[int]) -> dict:
    """Exact-move and outcome accuracy of one choice per position, overall, by phase and by the
    position's true result, and what kind each miss is (`misses`): one that gives the result
    away, one that keeps it a single step off the best (a win one own stone later, a loss one
    earlier) and one further off. A search that misses by one step lacks the value head's
    ranking of near-equal results; one that gives results away lacks tactics or judgement."""
    if len(positions) != len(choices):
        raise ValueError(f"{len(choices)} choices for {len(positions)} positions")
    exact = np.array([p.is_exact(int(c)) for p, c in zip(positions, choices)], dtype=bool)
    outcome = np.array([p.keeps_outcome(int(c)) for p, c in zip(positions, choices)], dtype=bool)
    def split(groups: Sequence[tuple[str, object]], member) -> dict:
        out = {}
        for name, key in groups:
            idx = [i for i, p in enumerate(positions) if member(p, key)]
            if idx:
                out[name] = {"positions": len(idx), "exact": round(float(exact[idx].mean()), 4),
                             "outcome": round(float(outcome[idx].mean()), 4)}
        return out

    phases = split([(name, (low, high)) for name, low, high in PHASES], lambda p, k: k[0] <= p.ply <= k[1])
    results = split(RESULTS, lambda p, sign: np.sign(p.best) == sign)
    return {"positions": len(positions), "exact": round(float(exact.mean()), 4),
            "outcome": round(float(outcome.mean()), 4), "by_phase": phases, "by_result": results,
            "misses": _miss_kinds(positions, choices, exact, outcome)}


def _miss_kinds(positions: Sequence[ScoredPosition], choices: Sequence[int], exact: np.ndarray,
                outcome: np.ndarray) -> dict[str, int]:
    """How many non-exact choices give the result away ("result"), keep it one score step
    short of the best ("one_step") or more ("further"), from `accuracy`'s per-choice verdicts
    (an exact choice always keeps the outcome)."""
    result = int((~outcome).sum())
    one_step = sum(1 for p, c, e, o in zip(positions, choices, exact, outcome)
                   if o and not e and p.best - p.score_of(int(c)) == 1)
    return {"result": result, "one_step": one_step, "further": int((~exact).sum()) - result - one_step}


def random_mover_accuracy(positions: Sequence[ScoredPosition]) -> dict:
    """Expected accuracy of a uniformly random legal move: the floor every model must clear."""
    exact, outcome = [], []
    for p in positions:
        legal = [s for s in p.scores if s is not None]
        exact.append(sum(s == p.best for s in legal) / len(legal))
        outcome.append(sum(np.sign(s) == np.sign(p.best) for s in legal) / len(legal))
    return {"positions": len(positions), "exact": round(float(np.mean(exact)), 4),
            "outcome": round(float(np.mean(outcome)), 4)}


def seen_in(positions: Sequence[ScoredPosition], planes: np.ndarray, game: Game | None = None) -> list[bool]:
    """Whether each position occurs among `planes` (a dataset's training inputs, mirror images
    included), compared as the exact input the network gets."""
    game = game or get_game(DEFAULT_GAME)
    stored = {np.ascontiguousarray(row, dtype=np.float32).tobytes() for row in planes}
    return [np.ascontiguousarray(game.parse(p.moves).planes(), dtype=np.float32).tobytes() in stored
            for p in positions]


def coverage(positions: Sequence[ScoredPosition], choices: Sequence[int], seen: Sequence[bool]) -> dict:
    """Accuracy on the positions a dataset holds and on those it does not: is a model weak where
    self-play never went (coverage), or also where it trained (targets, capacity)?"""
    if not len(positions) == len(choices) == len(seen):
        raise ValueError(f"{len(positions)} positions, {len(choices)} choices, {len(seen)} seen flags")
    split = {}
    for name, flag in (("seen", True), ("unseen", False)):
        idx = [i for i, s in enumerate(seen) if bool(s) == flag]
        if idx:
            split[name] = accuracy([positions[i] for i in idx], [choices[i] for i in idx])
    return {"positions_seen": int(sum(bool(s) for s in seen)), **split}


# ---- choosing moves --------------------------------------------------------------------------


def network_choices(net: PolicyValueNet, positions: Sequence[ScoredPosition], game: Game | None = None,
                    batch: int = 512) -> list[int]:
    """The raw policy's argmax over legal moves for every position (batched forward passes)."""
    game = game or get_game(DEFAULT_GAME)
    evaluator = NetworkEvaluator(net, game)
    choices: list[int] = []
    for start in range(0, len(positions), batch):
        states = [game.parse(p.moves) for p in positions[start:start + batch]]
        priors, _ = evaluator.evaluate(states)
        choices += [int(np.argmax(row)) for row in priors]
    return choices


def value_choices(net: PolicyValueNet, positions: Sequence[ScoredPosition], game: Game | None = None) -> list[int]:
    """The move whose position the value head rates best for the mover, one ply deep, no search.

    The search ranks moves of near-equal promise by the value head alone, so this is the head's
    share of the search's accuracy, apart from the policy's: a move that wins on the spot comes
    first (it is always the quickest win), a move that fills the board scores a draw, and every
    other child is worth minus the network's value for the opponent, all children of all
    positions in one batch."""
    game = game or get_game(DEFAULT_GAME)
    evaluator = NetworkEvaluator(net, game)
    scored: list[dict[int, float]] = []
    children: list[GameState] = []
    slots: list[tuple[int, int]] = []  # (position index, move) of each child still to evaluate
    for i, position in enumerate(positions):
        state = game.parse(position.moves)
        values: dict[int, float] = {}
        for move in state.legal_moves():
            child = state.play(move)
            if child.is_terminal:
                values[move] = WIN_ON_THE_SPOT if child.winner is not None else 0.0
            else:
                children.append(child)
                slots.append((i, move))
        scored.append(values)
    for start in range(0, len(children), VALUE_BATCH):
        _, values = evaluator.evaluate(children[start:start + VALUE_BATCH])
        for (i, move), value in zip(slots[start:start + VALUE_BATCH], values):
            scored[i][move] = -float(value)
    return [max(values, key=values.__getitem__) for values in scored]


def mcts_choices(net: PolicyValueNet, positions: Sequence[ScoredPosition], simulations: int,
                 cfg: SearchConfig, game: Game | None = None, batch: int = 256, seed: int = 0) -> list[int]:
    """The most visited move of a noise-free search per position; `batch` trees advance in
    lock step, so each network call evaluates one leaf of each of them."""
    game = game or get_game(DEFAULT_GAME)
    evaluator = NetworkEvaluator(net, game)
    rng = np.random.default_rng(seed)
    choices: list[int] = []
    forest = SearchForest.for_search(game, cfg, trees=min(batch, len(positions)))
    for start in range(0, len(positions), batch):
        slots = [forest.add(game.parse(p.moves)) for p in positions[start:start + batch]]
        results = forest.search(slots, evaluator, simulations, cfg, rng, add_noise=False)
        choices += [r.best_action for r in results]
        for slot in slots:
            forest.release(slot)
    return choices


def score_model(net: PolicyValueNet, positions: Sequence[ScoredPosition], simulations: Sequence[int] = (0,),
                cfg: SearchConfig | None = None, game: Game | None = None) -> dict:
    """{"raw": accuracy, "value": accuracy, "mcts": {"<sims>": accuracy + seconds}} for each
    budget asked: 0 means the raw network, scored twice, by its policy ("raw") and by its value
    head one ply deep ("value", `value_choices`)."""
    cfg = cfg or SearchConfig()
    game = game or get_game(DEFAULT_GAME)
    report: dict = {"positions": len(positions)}
    for sims in dict.fromkeys(int(s) for s in simulations):
        if sims < 0:
            raise ValueError(f"simulations must be >= 0, got {sims}")
        started = time.perf_counter()
        if sims == 0:
            report["raw"] = {**accuracy(positions, network_choices(net, positions, game)),
                             "seconds": round(time.perf_counter() - started, 2)}
            started = time.perf_counter()
            report["value"] = {**accuracy(positions, value_choices(net, positions, game)),
                               "seconds": round(time.perf_counter() - started, 2)}
        else:
            choices = mcts_choices(net, positions, sims, cfg, game)
            report.setdefault("mcts", {})[str(sims)] = {
                **accuracy(positions, choices), "seconds": round(time.perf_counter() - started, 2)}
    return report
