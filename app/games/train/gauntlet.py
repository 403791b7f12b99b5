"""Gauntlet: a candidate plays the baselines and the current best; every game is recorded.

Games are played by `app/games/train/match_games.py`: waves of a match's games in lock step, in
worker processes (spawned, one torch thread each; `workers <= 1` plays in this process), each
pair of games from its own random opening with the candidate on each side once, so no two
games are the same game and neither colour is favoured. Against baselines a fixed number of
games is played; against the current best a sequential probability ratio test stops the match
as soon as it is decided, or at a cap. After the gauntlet, Elo is refitted over every game
ever recorded in the registry.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from app.games.search.players import PlayerSpec, model_sha_of_player, parse_player_spec
from app.config import Settings
from app.db.registry import MatchGame, ModelRegistry
from app.games.train.elo import Rating, fit_elo_chains, rating_order
from app.games.train.gauntlet_baselines import Baseline, anchor_player
from app.games.train.match_games import (
    GameOutcome, GameTask, InlineExecutor, cut_waves, match_executor, match_tasks, run_wave,
)
from app.games.train.sprt import SprtDecision, SprtResult, sprt_decision

ProgressCallback = Callable[[dict], None]


class GauntletStopped(RuntimeError):
    """`should_stop` asked the gauntlet to end early (a draining node); no report is made."""


@dataclass
class OpponentResult:
    """A candidate's tally against one opponent. A game of two seats counts once; a game of
    N > 2 seats counts each of the candidate's N - 1 seat pairs (app/db/seat_pairs.py), so
    `games` counts results, `score` is 0.5 between equal players, and the SPRT reads pairs
    (correlated within a game: it decides somewhat sooner than the games alone would allow)."""

    opponent: str  # the opponent player's name
    kind: str  # random | heuristic | rollout | best
    wins: int = 0
    draws: int = 0
    losses: int = 0
    sprt: SprtResult | None = None
    stopped: str = "fixed"  # fixed | sprt | cap

    @property
    def games(self) -> int:
        return self.wins + self.draws + self.losses

    def add(self, score: float) -> None:
        """Count one result: 1 a win, 0.5 a draw, 0 a loss."""
        if score not in (0.0, 0.5, 1.0):
            raise ValueError(f"a result is 0, 0.5 or 1, not {score}")
        self.wins += score == 1.0
        self.draws += score == 0.5
        self.losses += score == 0.0

    @property
    def score(self) -> float:
        return (self.wins + 0.5 * self.draws) / self.games if self.games else 0.0

    def to_json(self) -> dict:
        return {"opponent": self.opponent, "kind": self.kind, "wins": self.wins, "draws": self.draws,
                "losses": self.losses, "games": self.games, "score": self.score, "stopped": self.stopped,
                "sprt": None if self.sprt is None else self.sprt.to_json()}


@dataclass
class GauntletReport:
    match_id: str
    candidate: str  # player name
    candidate_sha256: str | None
    results: list[OpponentResult] = field(default_factory=list)
    ratings: list[Rating] = field(default_factory=list)  # every rated player, strongest first
    elapsed_s: float = 0.0
    anchor: str = "random"  # the player the ratings are relative to (Elo 0)

    def result(self, kind: str) -> OpponentResult | None:
        return next((r for r in self.results if r.kind == kind), None)

    def to_json(self) -> dict:
        return {"match_id": self.match_id, "candidate": self.candidate, "candidate_sha256": self.candidate_sha256,
                "results": [r.to_json() for r in self.results], "ratings": [r.to_json() for r in self.ratings],
                "elapsed_s": self.elapsed_s, "anchor": self.anchor}


# --- the match loop (parent process) ----------------------------------------------------


def _play_match(
    executor, tasks: list[GameTask], result: OpponentResult, settings: Settings,
    record: Callable[[GameTask, GameOutcome], None], sequential_test: bool, workers: int,
    progress: ProgressCallback | None, should_stop: Callable[[], bool] | None = None,
) -> None:
    """Submit waves of games, one per worker at a time; stop early when the SPRT decides (best
    only). Games of a wave finished after the decision are recorded for Elo, not counted."""
    cfg = settings.gauntlet
    pending: dict[Future, tuple[GameTask, ...]] = {}
    queue: Iterator[tuple[GameTask, ...]] = iter(cut_waves(tasks, workers))
    decided = False
    played = 0
    in_flight = max(1, workers)
    try:
        while True:
            if should_stop is not None and should_stop():
                raise GauntletStopped("gauntlet stopped on request; its games so far are recorded")
            while not decided and len(pending) < in_flight:
                wave = next(queue, None)
                if wave is None:
                    break
                args = (wave, should_stop) if isinstance(executor, InlineExecutor) else (wave,)
                pending[executor.submit(run_wave, *args)] = wave
            if not pending:
                break
            done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
            for fut in done:
                by_index = {task.index: task for task in pending.pop(fut)}
                for outcome in fut.result():
                    record(by_index[outcome.index], outcome)
                    if decided:
                        continue
                    played += 1
                    for score in outcome.pair_scores():
                        result.add(score)
                    if sequential_test:
                        result.sprt = sprt_decision(result.wins, result.draws, result.losses, cfg.sprt_elo0,
                                                    cfg.sprt_elo1, cfg.sprt_alpha, cfg.sprt_beta)
                        if result.sprt.decision is not SprtDecision.CONTINUE:
                            decided = True
                            result.stopped = "sprt"
                        elif played >= len(tasks):
                            result.stopped = "cap"
                if progress is not None:
                    progress({"opponent": result.opponent, "kind": result.kind, "games": result.games,
                              "wins": result.wins, "draws": result.draws, "losses": result.losses,
                              "sprt": None if result.sprt is None else result.sprt.to_json()})
    finally:
        for fut in pending:
            fut.cancel()


def _on_device(spec: PlayerSpec, settings: Settings) -> PlayerSpec:
    """A network player's spec with the node's gauntlet device resolved ("auto" -> cpu / cuda)."""
    if spec.kind != "net":
        return spec
    from app.shared.process_group import network_device  # torch: only once a network plays

    return replace(spec, device=network_device(settings.gauntlet.device).type)


def play_fixed_match(
    candidate: PlayerSpec, opponent: PlayerSpec, games: int, settings: Settings, seed: int,
    record: Callable[[GameTask, GameOutcome], None], workers: int = 1,
    should_stop: Callable[[], bool] | None = None,
) -> OpponentResult:
    """One fixed-size match without SPRT: a shard of a baseline match that another node plays.
    Openings (and so the games) follow from `seed`; the candidate takes each side once per pair."""
    executor = match_executor(workers)
    result = OpponentResult(opponent.name, opponent.kind)
    try:
        candidate, opponent = _on_device(candidate, settings), _on_device(opponent, settings)
        tasks = match_tasks(candidate, opponent, games, settings, np.random.default_rng(seed))
        _play_match(executor, tasks, result, settings, record, False, workers, None, should_stop)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
    return result


def registry_rating_order(registry: ModelRegistry, games: list) -> list[str]:
    """The players of `games`, random first, then models by their registry generation."""
    generation = {m.sha256: m.generation for m in registry.models()}
    return rating_order({p for row in games for p in row[:2]}, lambda p: generation.get(model_sha_of_player(p) or ""))


def recompute_ratings(registry: ModelRegistry, net_simulations: int, anchor: str = "random") -> list[Rating]:
    """Refit Elo over every recorded game and store it; a model's registry Elo is the rating
    of its network player at the configured search budget, relative to `anchor` (the fixed
    anchor every gauntlet plays, gauntlet_baselines.anchor_player). Models whose games never
    reach it (a run from before the anchor games) are rated against random where their games
    reach it, else along their chain, the earliest generation at 0 (elo.fit_elo_chains)."""
    games = registry.match_results()
    fit = fit_elo_chains(games, anchor=anchor, order=registry_rating_order(registry, games))
    ratings = sorted((r for r in fit.ratings.values() if r.games), key=lambda r: -r.elo)  # not an unplayed anchor
    suffix = f":s{net_simulations}"
    model_player = {r.player: sha for r in ratings
                    if (sha := model_sha_of_player(r.player)) is not None and r.player.endswith(suffix)}
    registry.store_ratings([(r.player, r.elo, r.low, r.high, r.games) for r in ratings], model_player)
    return ratings


def rated_anchor(ratings: list[Rating], anchor: str) -> str:
    """What a table of `ratings` is relative to: the anchor when its games are recorded, else
    random (the fit's fallback), else the chain's first generation."""
    rated = {r.player for r in ratings if r.games}
    if anchor in rated:
        return anchor
    return "random" if "random" in rated else "the earliest generation"


def run_gauntlet(
    candidate_path: str | Path,
    baselines: Sequence[str | Baseline],
    best_path: str | Path | None,
    settings: Settings,
    registry_db: str | Path | ModelRegistry,
    workers: int | None = None,
    seed: int = 0,
    progress: ProgressCallback | None = None,
    games_per_baseline: int | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> GauntletReport:
    """Play the candidate against each baseline (fixed games) and the best (SPRT), record
    every game in the registry, refit Elo against the configured anchor. A baseline is a spec
    text (played `games_per_baseline` games, reported under its kind) or a `Baseline` with its
    own kind and count (gauntlet_baselines.planned_baselines: the gate's and the anchor).
    `candidate_path` may also be a baseline spec ('heuristic:3') playing the node's game
    (`node.game`), which makes the CLI useful before any model exists."""
    started = time.monotonic()
    cfg = settings.gauntlet
    workers = cfg.workers if workers is None else workers
    games_per_baseline = cfg.games_vs_baseline if games_per_baseline is None else games_per_baseline
    candidate = _on_device(parse_player_spec(str(candidate_path), cfg, settings.search, game=settings.node.game),
                           settings)
    opponents: list[tuple[str, PlayerSpec, int]] = []
    for baseline in baselines:
        text = baseline.spec if isinstance(baseline, Baseline) else baseline
        spec = parse_player_spec(text, cfg, settings.search, game=candidate.game)
        if isinstance(baseline, Baseline):
            opponents.append((baseline.kind, spec, baseline.games))
        else:
            opponents.append((spec.kind, spec, games_per_baseline))
    if best_path is not None:
        best = _on_device(parse_player_spec(str(best_path), cfg, settings.search, game=candidate.game), settings)
        if best.name != candidate.name:
            opponents.append(("best", best, cfg.max_games_vs_best))
    registry = registry_db if isinstance(registry_db, ModelRegistry) else ModelRegistry(registry_db)
    match_id = uuid.uuid4().hex[:16]
    report = GauntletReport(match_id, candidate.name, candidate.sha256)
    rng = np.random.default_rng(seed)
    game_name = candidate.game

    def record_for(opponent: PlayerSpec) -> Callable[[GameTask, GameOutcome], None]:
        def record(task: GameTask, outcome: GameOutcome) -> None:
            p0, p1, winner, seats = outcome.record(candidate.name, opponent.name)
            registry.add_match_games([MatchGame(
                uid=f"{match_id}-{opponent.name}-{task.index}", match_id=match_id, game=game_name,
                player0=p0, player1=p1, winner=winner, moves=outcome.moves,
                opening_plies=outcome.opening_plies, created_at=time.time(), seats=seats)])
        return record

    executor = match_executor(workers)
    try:
        for kind, spec, games in opponents:
            is_best = kind == "best"
            result = OpponentResult(spec.name, kind)
            report.results.append(result)
            tasks = match_tasks(candidate, spec, games, settings, rng)
            _play_match(executor, tasks, result, settings, record_for(spec), is_best, workers, progress,
                        should_stop)
        anchor = anchor_player(settings)
        report.ratings = recompute_ratings(registry, cfg.net_simulations, anchor)
        report.anchor = rated_anchor(report.ratings, anchor)
    finally:
        executor.shutdown(wait=True, cancel_futures=True)
        if not isinstance(registry_db, ModelRegistry):
            registry.close()
    report.elapsed_s = time.monotonic() - started
    return report


# --- presentation ------------------------------------------------------------------------


def short_name(player: str) -> str:
    """'model:<64 hex>:s64' -> 'model:<12 hex>:s64' for tables."""
    sha = model_sha_of_player(player)
    return player.replace(sha, sha[:12]) if sha else player


def format_table(report: GauntletReport) -> str:
    """The CLI's human-readable summary: results per opponent, then the Elo table."""
    lines = [f"gauntlet {report.match_id}: candidate {short_name(report.candidate)} "
             f"({report.elapsed_s:.1f} s)", ""]
    header = f"{'opponent':<28} {'games':>5} {'W':>4} {'D':>4} {'L':>4} {'score':>6}  stop   SPRT"
    lines += [header, "-" * len(header)]
    for r in report.results:
        sprt = "-" if r.sprt is None else (
            f"{r.sprt.decision.value} (LLR {r.sprt.llr:+.2f} in [{r.sprt.lower:.2f}, {r.sprt.upper:.2f}])")
        lines.append(f"{short_name(r.opponent):<28} {r.games:>5} {r.wins:>4} {r.draws:>4} {r.losses:>4} "
                     f"{r.score:>6.3f}  {r.stopped:<6} {sprt}")
    lines += ["", f"Elo (maximum likelihood over all recorded games, {report.anchor} = 0, 95 % interval)"]
    header = f"{'player':<28} {'elo':>7} {'low':>7} {'high':>7} {'games':>6}"
    lines += [header, "-" * len(header)]
    for r in report.ratings:
        mark = " *" if r.player == report.candidate else ""
        lines.append(f"{short_name(r.player):<28} {r.elo:>7.0f} {r.low:>7.0f} {r.high:>7.0f} {r.games:>6}{mark}")
    return "\n".join(lines)

