"""What a finished game of N seats says about its players two at a time.

Elo (Bradley-Terry) and the gauntlet's win/draw/loss tallies compare two players; a game of
N > 2 seats has no single winner-vs-loser pair. It is read as the results of its seat pairs:
each two seats held by different players, the one with the higher return won that pair, equal
returns drew it. Between equal players this scores 0.5 whatever N is (a candidate that wins a
third of three-seat games beats one seat in each game it loses: 1/3 x 1 + 2/3 x 0.25 = 0.5),
which the old reading ("did the candidate alone come first") did not: it scored 1/3.

Pure functions; the registry (app/db/registry.py) stores each seat's (player, return), the
gauntlet (app/games/train/match_games.py) tallies a candidate's pairs.
"""

from __future__ import annotations

from collections.abc import Sequence

Seat = tuple[str, float]  # (player name, the seat's return)
MAX_SEATS = 16  # the most seats a stored or gossiped game may have (the design trains 2 to 4)


def pair_score(mine: float, other: float) -> float:
    """1 when `mine` is the higher return, 0.5 when equal, 0 when lower."""
    return 1.0 if mine > other else 0.5 if mine == other else 0.0


def seat_scores(returns: Sequence[float], seat: int) -> list[float]:
    """The results of `seat` against every other seat, in seat order."""
    return [pair_score(returns[seat], r) for s, r in enumerate(returns) if s != seat]


def seat_pairs(seats: Sequence[Seat]) -> list[tuple[str, str, float]]:
    """(player a, player b, a's score) for every two seats held by different players (a's seat
    first): the rows an Elo fit takes. Two seats of one player say nothing about its rating."""
    out = []
    for i, (a, ra) in enumerate(seats):
        for b, rb in seats[i + 1:]:
            if a != b:
                out.append((a, b, pair_score(ra, rb)))
    return out


def player_scores(seats: Sequence[Seat], player: str) -> list[float]:
    """`player`'s results against every seat of another player (its own seats left out)."""
    return [pair_score(mine, other) for p, mine in seats if p == player for q, other in seats if q != player]
