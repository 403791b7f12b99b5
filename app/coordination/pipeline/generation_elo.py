"""Elo of every decided generation, from the games the cluster's records carry (pure).

Each node's registry holds only the gauntlet games that node played, so in a cluster no
registry sees the whole chain of candidate-vs-best matches, and each would anchor what it sees
differently. The decided records carry every gauntlet's results (`GenerationRecord.matches`)
and are the same on every node, so a fit over them gives every node the same ratings: anchored
at the fixed anchor every gauntlet plays (`gauntlet.anchor`, pinned at 0), else at random where
the games reach it (runs recorded before the anchor games), else at the chain's earliest
generation (app/games/train/elo.py `fit_elo_chains`). Wins, draws and losses per pair are all a
Bradley-Terry fit needs, so the summary loses nothing the registry's games would add.
"""

from __future__ import annotations

from collections.abc import Mapping

from app.games.search.player_specs import model_sha_of_player
from app.coordination.pipeline.generation_log import GenerationRecord
from app.games.train.elo import Rating, chain_anchors, fit_elo_chains, rating_order


def match_rows(records: Mapping[int, GenerationRecord]) -> list[tuple[str, str, float, float]]:
    """(candidate player, opponent player, candidate's total score, games) per match the
    records carry: the summary form elo.pair_counts takes, never expanded game by game."""
    rows: list[tuple[str, str, float, float]] = []
    for generation in sorted(records):
        matches = records[generation].matches
        if not matches:
            continue
        for opponent, wins, draws, losses in matches["results"]:
            rows.append((matches["player"], opponent, wins + 0.5 * draws, float(wins + draws + losses)))
    return rows


def _order(records: Mapping[int, GenerationRecord], games: list) -> tuple[dict[str, int], list[str]]:
    """sha256 -> its generation (the earliest, should two share a model) and the players of
    `games` in the order a group without the anchor is anchored by (elo.rating_order)."""
    generation_of = {r.sha256: g for g, r in sorted(records.items(), reverse=True)}  # the earliest wins
    players = {p for row in games for p in row[:2]}
    return generation_of, rating_order(players, lambda p: generation_of.get(model_sha_of_player(p) or ""))


def rate_generations(records: Mapping[int, GenerationRecord], anchor: str = "random") -> dict[int, Rating]:
    """generation -> its model's rating (with the 95 % interval) relative to `anchor` (the
    configured fixed anchor's player name, gauntlet_baselines.anchor_player), for every
    generation whose model played or was played in a recorded gauntlet."""
    games = match_rows(records)
    if not games:
        return {}
    fit = fit_elo_chains(games, anchor=anchor, order=_order(records, games)[1])
    by_sha: dict[str, list[Rating]] = {}
    for name, rating in fit.ratings.items():
        sha = model_sha_of_player(name)
        if sha is not None:
            by_sha.setdefault(sha, []).append(rating)
    out: dict[int, Rating] = {}
    for generation, record in records.items():
        own = record.matches["player"] if record.matches else None
        ratings = by_sha.get(record.sha256, [])
        if ratings:  # its own player when it played, else the player that played it most
            out[generation] = next((r for r in ratings if r.player == own), max(ratings, key=lambda r: r.games))
    return out


def anchor_label(anchor_player: str | None, generation_of: Mapping[str, int]) -> str | None:
    """What an Elo is relative to, for a human: "random", "generation 3", or the player."""
    if anchor_player is None:
        return None
    sha = model_sha_of_player(anchor_player)
    if sha is not None and sha in generation_of:
        return f"generation {generation_of[sha]}"
    return anchor_player


def generation_anchors(records: Mapping[int, GenerationRecord], anchor: str = "random") -> dict[int, str]:
    """generation -> what its Elo (rate_generations with the same `anchor`) is relative to."""
    games = match_rows(records)
    if not games:
        return {}
    generation_of, order = _order(records, games)
    anchors = chain_anchors(games, anchor, order)
    out: dict[int, str] = {}
    for generation, record in records.items():
        own = record.matches["player"] if record.matches else None
        mine = [a for p, a in anchors.items() if model_sha_of_player(p) == record.sha256]
        relative_to = anchors.get(own) if own in anchors else (mine[0] if mine else None)
        label = anchor_label(relative_to, generation_of)
        if label is not None:
            out[generation] = label
    return out
