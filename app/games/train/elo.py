"""Elo ratings by maximum likelihood (Bradley-Terry) over every recorded game.

Incremental Elo depends on the order games were played and forgets nothing wrongly or
everything slowly; a maximum-likelihood fit over all games is order-free and gives
confidence intervals from the curvature of the likelihood. Draws count as half a win for
each side. The random player is the anchor at 0, so "Elo" means "stronger than random by".

A run whose gauntlet never plays random (no gate configured: each candidate plays only the
previous best) is a chain of models with no path to that anchor. `fit_elo_chains` rates each
such chain on its own, anchored at its first player in a given order (the earliest
generation at 0), so Elo exists whenever the gauntlet plays anything; `EloFit.anchor_of` says
which anchor each rating is relative to.

A player who won every game has an infinite MLE; like BayesElo we add `prior_draws` virtual
draws to every pair that played, which keeps ratings finite and matters little once a pair
has played many games. Players with no chain of games to the anchor cannot be placed on its
scale and are left out (listed in `unrated`). Pure numpy, Newton's method.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

ELO_PER_NAT = 400.0 / math.log(10.0)  # logistic scale: P(win) = 1 / (1 + 10^(-diff/400))
Z95 = 1.959963984540054


@dataclass(frozen=True)
class Rating:
    player: str
    elo: float
    low: float  # 95 % confidence interval
    high: float
    games: int

    def to_json(self) -> dict:
        return {"player": self.player, "elo": self.elo, "low": self.low, "high": self.high, "games": self.games}


@dataclass(frozen=True)
class EloFit:
    ratings: dict[str, Rating]  # anchor included, at 0 with a zero-width interval
    unrated: list[str]  # players not connected to the anchor
    anchor: str
    iterations: int
    anchor_of: dict[str, str] = field(default_factory=dict)  # fit_elo_chains: player -> its chain's anchor


class EloFitError(ValueError):
    """The fit did not converge (should not happen with a positive prior)."""


Game = tuple[str, str, float] | tuple[str, str, float, float]


def pair_counts(games: Iterable[Game]) -> dict[tuple[str, str], list[float]]:
    """{(a, b): [score of a, games]} with a < b, from (player_a, player_b, score_of_a) rows, one
    per game, or (player_a, player_b, total score of a, games) rows, one per match: a match's
    wins, draws and losses are all the fit needs, so a summary never has to be expanded."""
    out: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for row in games:
        a, b, score = row[0], row[1], float(row[2])
        n = float(row[3]) if len(row) > 3 else 1.0
        if a == b or n == 0:
            continue  # a player against itself says nothing about its rating
        if not 0.0 <= score <= n:
            raise ValueError(f"score {score} of {a} vs {b} is outside [0, {n:g}]")
        if a > b:
            a, b, score = b, a, n - score
        out[(a, b)][0] += score
        out[(a, b)][1] += n
    return dict(out)


def _component(anchor: str, pairs: Iterable[tuple[str, str]]) -> set[str]:
    neighbours: dict[str, set[str]] = defaultdict(set)
    for a, b in pairs:
        neighbours[a].add(b)
        neighbours[b].add(a)
    seen, todo = {anchor}, [anchor]
    while todo:
        for nxt in neighbours[todo.pop()] - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def fit_elo(
    games: Iterable[Game],
    anchor: str = "random",
    prior_draws: float = 1.0,
    max_iter: int = 100,
    tol: float = 1e-10,
) -> EloFit:
    """Fit ratings to (player_a, player_b, score_of_a) games, score 1, 0.5 or 0 per game (or
    match rows, see `pair_counts`)."""
    counts = pair_counts(games)
    players_all = sorted({p for pair in counts for p in pair})
    connected = _component(anchor, counts) if anchor in players_all else {anchor}
    unrated = [p for p in players_all if p not in connected]
    free = sorted(connected - {anchor})
    index = {p: i for i, p in enumerate(free)}
    games_of: dict[str, int] = defaultdict(int)
    rows = []  # (i, j, score of i, n) with index -1 for the anchor
    for (a, b), (score, n) in counts.items():
        games_of[a] += int(n)
        games_of[b] += int(n)
        if a in connected:
            rows.append((index.get(a, -1), index.get(b, -1), score + 0.5 * prior_draws, n + prior_draws))
    ratings = {anchor: Rating(anchor, 0.0, 0.0, 0.0, games_of.get(anchor, 0))}
    if not free:
        return EloFit(ratings, unrated, anchor, 0)

    k = len(free)
    theta = np.zeros(k)  # ratings in nats
    iterations = 0
    for iterations in range(1, max_iter + 1):
        grad, hess = _grad_hess(theta, rows, k)
        step = np.linalg.solve(hess, grad)  # hess is negative definite: Newton ascent
        # Damp huge first steps so a lopsided pair cannot overshoot into overflow.
        scale = min(1.0, 2.0 / max(1e-12, float(np.max(np.abs(step)))))
        theta = theta - scale * step
        if float(np.max(np.abs(scale * step))) < tol:
            break
    else:
        raise EloFitError(f"Elo fit did not converge in {max_iter} iterations")
    _, hess = _grad_hess(theta, rows, k)
    cov = np.linalg.inv(-hess)
    for p, i in index.items():
        elo = float(theta[i] * ELO_PER_NAT)
        half = float(Z95 * math.sqrt(max(cov[i, i], 0.0)) * ELO_PER_NAT)
        ratings[p] = Rating(p, elo, elo - half, elo + half, games_of[p])
    return EloFit(ratings, unrated, anchor, iterations)


def fit_elo_chains(
    games: Iterable[Game],
    anchor: str = "random",
    order: Sequence[str] = (),
    prior_draws: float = 1.0,
) -> EloFit:
    """`fit_elo` over the players connected to `anchor`, then each other connected group of
    players fitted alone, anchored at 0 at its first player in `order` (players not in `order`
    come after it, by name). Every player who played a game is rated; `unrated` stays empty."""
    games = list(games)
    main = fit_elo(games, anchor=anchor, prior_draws=prior_draws)
    ratings = dict(main.ratings)
    anchor_of = {p: anchor for p in ratings}
    rank = {p: i for i, p in enumerate(order)}
    left = set(main.unrated)
    counts = pair_counts(games)
    while left:
        first = min(left, key=lambda p: (rank.get(p, len(rank)), p))
        group = _component(first, counts) & left
        fit = fit_elo([g for g in games if g[0] in group and g[1] in group], anchor=first, prior_draws=prior_draws)
        ratings.update(fit.ratings)
        anchor_of.update({p: first for p in fit.ratings})
        left -= group
    return EloFit(ratings, [], anchor, main.iterations, anchor_of)


def _grad_hess(theta: np.ndarray, rows: list[tuple[int, int, float, float]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian of the Bradley-Terry log-likelihood (anchor fixed at 0)."""
    grad = np.zeros(k)
    hess = np.zeros((k, k))
    for i, j, score, n in rows:
        ti = theta[i] if i >= 0 else 0.0
        tj = theta[j] if j >= 0 else 0.0
        p = 1.0 / (1.0 + math.exp(-(ti - tj)))
        g = score - n * p  # d/d ti
        w = n * p * (1.0 - p)
        if i >= 0:
            grad[i] += g
            hess[i, i] -= w
        if j >= 0:
            grad[j] -= g
            hess[j, j] -= w
        if i >= 0 and j >= 0:
            hess[i, j] += w
            hess[j, i] += w
    return grad, hess


def rating_order(players: Iterable[str], generation_of: Callable[[str], int | None]) -> list[str]:
    """The `order` fit_elo_chains anchors a group without the anchor by: the random player first
    (the anchor before a fixed one was configured: runs recorded then stay rated against it),
    then models by generation (the earliest first), then the rest by name."""
    def key(player: str) -> tuple[bool, int, str]:
        generation = generation_of(player)
        return player != "random", (1 << 62) if generation is None else generation, player
    return sorted(players, key=key)


def chain_anchors(games: Iterable[Game], anchor: str = "random", order: Sequence[str] = ()) -> dict[str, str]:
    """player -> the player its rating is relative to, as `fit_elo_chains` anchors it (without
    fitting): `anchor` for every player connected to it by games, else its group's first
    player in `order`. What a panel names beside an Elo ("vs random", "vs generation 1")."""
    counts = pair_counts(list(games))
    players = {p for pair in counts for p in pair}
    main = _component(anchor, counts) if anchor in players else set()
    out = {p: anchor for p in main}
    rank = {p: i for i, p in enumerate(order)}
    left = players - main
    while left:
        first = min(left, key=lambda p: (rank.get(p, len(rank)), p))
        group = _component(first, counts) & left
        out.update({p: first for p in group})
        left -= group
    return out
