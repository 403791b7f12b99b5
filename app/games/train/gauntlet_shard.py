"""Gauntlet shards: a slice of one baseline match played anywhere, and the merge back into one report.

A baseline match (fixed games, no SPRT) needs no sequential decision, so it can be cut into
shards that different nodes play at once. A shard is fully described by the candidate, the
baseline, its game count and its seed (the seed picks its openings), so whoever plays it, the
result means the same thing. Every game carries a uid derived from the shard, which makes
recording idempotent: a shard seen twice (gossiped again, or played twice after a timeout)
is counted and recorded once, and the Elo fit counts each game once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from app.games.search.players import PlayerSpec, net_spec, parse_player_spec
from app.config import Settings
from app.db.registry import MatchGame, ModelRegistry
from app.db.seat_pairs import MAX_SEATS, Seat, player_scores
from app.games.train.gauntlet import OpponentResult, play_fixed_match
from app.games.train.match_games import GameOutcome, GameTask

MAX_MOVES_CHARS = 512  # a compact game record from gossip longer than this is refused


@dataclass(frozen=True)
class ShardGame:
    """One game in the compact form that travels in gossip: players in colour order, result,
    moves; a game of N > 2 seats also each seat's (player, return) ("s"; a node from before
    seats sends none and its game is read as two seats, as it was)."""

    uid: str
    player0: str
    player1: str
    winner: int | None  # 0 or 1 (the side that won), None for a draw
    moves: str
    opening_plies: int = 0
    seats: tuple[Seat, ...] = ()

    def to_json(self) -> dict:
        out = {"uid": self.uid, "p0": self.player0, "p1": self.player1, "w": self.winner,
               "m": self.moves, "o": self.opening_plies}
        if self.seats:
            out["s"] = [[player, result] for player, result in self.seats]
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "ShardGame":
        winner = data["w"]
        if winner not in (None, 0, 1):
            raise ValueError(f"winner {winner!r} is not 0, 1 or null")
        moves = str(data["m"])
        if len(moves) > MAX_MOVES_CHARS:
            raise ValueError(f"moves of game {data['uid']!r} are {len(moves)} characters")
        return cls(str(data["uid"]), str(data["p0"]), str(data["p1"]), winner, moves, int(data.get("o", 0)),
                   _seats_from_json(data.get("s", ())))

    def pair_scores(self, candidate: str) -> list[float]:
        """The candidate's results a tally counts (as GameOutcome.pair_scores)."""
        if self.seats:
            return player_scores(self.seats, candidate)
        if self.winner is None:
            return [0.5]
        return [1.0 if (self.player0, self.player1)[self.winner] == candidate else 0.0]

    def match_game(self, match_id: str, game: str) -> MatchGame:
        return MatchGame(uid=self.uid, match_id=match_id, game=game, player0=self.player0,
                         player1=self.player1, winner=self.winner, moves=self.moves,
                         opening_plies=self.opening_plies, created_at=time.time(), seats=self.seats)


def _seats_from_json(data: object) -> tuple[Seat, ...]:
    """Seats from gossip: none, or 3..MAX_SEATS [player, finite return] pairs."""
    if not isinstance(data, (list, tuple)) or not data:
        if data:
            raise ValueError(f"seats {data!r} are not a list")
        return ()
    if not 3 <= len(data) <= MAX_SEATS:
        raise ValueError(f"{len(data)} seats; a game with seats has 3..{MAX_SEATS}")
    seats = []
    for seat in data:
        if not (isinstance(seat, (list, tuple)) and len(seat) == 2 and isinstance(seat[0], str)
                and isinstance(seat[1], (int, float)) and not isinstance(seat[1], bool) and math.isfinite(seat[1])):
            raise ValueError(f"seat {seat!r} is not [player, finite return]")
        seats.append((seat[0], float(seat[1])))
    return tuple(seats)


@dataclass(frozen=True)
class ShardResult:
    """What a shard's player publishes: its tally and every game, for the claimant to record."""

    shard_id: str
    candidate_sha256: str
    opponent: str  # the baseline player's name, e.g. 'heuristic-d2'
    wins: int
    draws: int
    losses: int
    games: tuple[ShardGame, ...]
    played_by: str = ""

    def to_json(self) -> dict:
        return {"shard_id": self.shard_id, "candidate_sha256": self.candidate_sha256, "opponent": self.opponent,
                "wins": self.wins, "draws": self.draws, "losses": self.losses, "played_by": self.played_by,
                "games": [g.to_json() for g in self.games]}

    @classmethod
    def from_json(cls, data: Mapping) -> "ShardResult":
        return cls(str(data["shard_id"]), str(data["candidate_sha256"]), str(data["opponent"]),
                   int(data["wins"]), int(data["draws"]), int(data["losses"]),
                   tuple(ShardGame.from_json(g) for g in data["games"]), str(data.get("played_by", "")))


def shard_players(candidate_path: str | Path, baseline: str, settings: Settings,
                  net_simulations: int) -> tuple[PlayerSpec, PlayerSpec]:
    """(candidate, baseline) specs; the claimant fixes the search budget so every node plays
    (and names) the candidate the same way whatever its own config says."""
    cfg = settings.gauntlet
    candidate = net_spec(candidate_path, net_simulations, settings.search.c_puct)
    return candidate, parse_player_spec(baseline, cfg, settings.search, game=candidate.game)


def play_shard(
    candidate_path: str | Path, baseline: str, games: int, seed: int, shard_id: str, settings: Settings,
    registry_db: str | Path, net_simulations: int, workers: int = 1, played_by: str = "",
    should_stop: Callable[[], bool] | None = None,
) -> ShardResult:
    """Play one shard, record its games in this node's registry, and return them compactly.
    `baseline` is a player spec text with its parameters spelled out ('heuristic:2')."""
    candidate, opponent = shard_players(candidate_path, baseline, settings, net_simulations)
    played: list[ShardGame] = []

    def record(task: GameTask, outcome: GameOutcome) -> None:
        p0, p1, winner, seats = outcome.record(candidate.name, opponent.name)
        played.append(ShardGame(f"{shard_id}#{task.index}", p0, p1, winner, outcome.moves, outcome.opening_plies,
                                seats))

    result = play_fixed_match(candidate, opponent, games, settings, seed, record, workers, should_stop)
    with ModelRegistry(registry_db) as registry:
        registry.add_match_games(g.match_game(shard_id, candidate.game) for g in played)
    return ShardResult(shard_id, str(candidate.sha256), opponent.name, result.wins, result.draws, result.losses,
                       tuple(sorted(played, key=lambda g: g.uid)), played_by)


def shard_refusal(result: ShardResult, candidate: str, candidate_sha256: str, opponent: str,
                  max_games: int) -> str | None:
    """None when a published shard can be counted for this candidate and baseline, else why not."""
    if result.candidate_sha256 != candidate_sha256:
        return f"played for candidate {result.candidate_sha256[:12]}, not {candidate_sha256[:12]}"
    if result.opponent != opponent:
        return f"played against {result.opponent!r}, not {opponent!r}"
    if not result.games or len(result.games) > max_games:
        return f"{len(result.games)} games; expected 1..{max_games}"
    prefix = f"{result.shard_id}#"
    for g in result.games:
        if {g.player0, g.player1} != {candidate, opponent}:
            return f"game {g.uid} is {g.player0} vs {g.player1}"
        if g.seats and {p for p, _ in g.seats} != {candidate, opponent}:
            return f"game {g.uid}'s seats are {sorted({p for p, _ in g.seats})}"
        if not g.uid.startswith(prefix):
            return f"game uid {g.uid!r} is not of shard {result.shard_id!r}"
    tally = OpponentResult(opponent, "")
    for g in result.games:
        for score in g.pair_scores(candidate):
            tally.add(score)
    if (tally.wins, tally.draws, tally.losses) != (result.wins, result.draws, result.losses):
        return "its tally does not match its games"
    return None


@dataclass(frozen=True)
class MergedGauntlet:
    results: list[OpponentResult]  # one per baseline in the given order, then the best's
    games: list[ShardGame]  # every shard game, once, for the claimant's registry


def merge_shards(candidate: str, baselines: Iterable[tuple[str, str]], shards: Iterable[tuple[str, ShardResult]],
                 best: OpponentResult | None = None) -> MergedGauntlet:
    """Baseline results summed over their shards, each game counted once by uid.

    `baselines` lists (kind, opponent name) in report order; `shards` pairs each shard result
    with the kind it belongs to (checked beforehand with `shard_refusal`). Counting from the
    games rather than the published tallies is what makes a repeated shard harmless.
    """
    results = {kind: OpponentResult(name, kind) for kind, name in baselines}
    seen: set[str] = set()
    games: list[ShardGame] = []
    for kind, shard in shards:
        result = results.get(kind)
        if result is None:
            continue
        for g in shard.games:
            if g.uid in seen:
                continue
            seen.add(g.uid)
            games.append(g)
            for score in g.pair_scores(candidate):
                result.add(score)
    merged = list(results.values())
    if best is not None:
        merged.append(best)
    return MergedGauntlet(merged, games)
