"""Elo by maximum likelihood: recovers known ratings within their intervals; pure properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.games.train.elo import fit_elo, fit_elo_chains, pair_counts

TRUE = {"random": 0.0, "weak": 150.0, "mid": 400.0, "strong": 650.0}


def simulate(rng: np.random.Generator, truth: dict[str, float], games_per_pair: int,
             draw_rate: float = 0.0) -> list[tuple[str, str, float]]:
    """Round robin under the logistic model; draws replace equal shares of wins and losses."""
    names = list(truth)
    games = []
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            p = 1.0 / (1.0 + 10 ** (-(truth[a] - truth[b]) / 400))
            u = rng.random(games_per_pair)
            for x in u:
                if x < p - draw_rate / 2:
                    games.append((a, b, 1.0))
                elif x < p + draw_rate / 2:
                    games.append((a, b, 0.5))
                else:
                    games.append((a, b, 0.0))
    return games


def test_recovers_known_ratings_within_intervals() -> None:
    fit = fit_elo(simulate(np.random.default_rng(7), TRUE, 300, draw_rate=0.1))
    assert fit.ratings["random"].elo == 0.0
    for name, elo in TRUE.items():
        r = fit.ratings[name]
        assert r.low <= elo <= r.high, f"{name}: true {elo} outside [{r.low:.0f}, {r.high:.0f}]"
        if name != "random":
            assert r.high - r.low < 200  # informative, not vacuous
    order = sorted(TRUE, key=lambda n: fit.ratings[n].elo)
    assert order == ["random", "weak", "mid", "strong"]


@pytest.mark.timeout(60)
def test_interval_coverage_is_about_95_percent() -> None:
    rng = np.random.default_rng(11)
    truth = {"random": 0.0, "a": 200.0, "b": 350.0}
    covered = total = 0
    for _ in range(150):
        fit = fit_elo(simulate(rng, truth, 80), prior_draws=0.0)
        for name in ("a", "b"):
            r = fit.ratings[name]
            covered += r.low <= truth[name] <= r.high
            total += 1
    assert 0.89 <= covered / total <= 0.99


def test_a_clean_sweep_gets_a_finite_rating() -> None:
    fit = fit_elo([("random", "x", 0.0)] * 40)
    x = fit.ratings["x"]
    assert 300 < x.elo < 2000 and x.low < x.elo < x.high
    assert x.games == 40


def test_players_not_connected_to_the_anchor_are_unrated() -> None:
    fit = fit_elo([("random", "a", 0.0), ("b", "c", 1.0)])
    assert set(fit.ratings) == {"random", "a"}
    assert fit.unrated == ["b", "c"]
    assert fit_elo([]).ratings["random"].elo == 0.0


def test_scores_outside_0_1_are_rejected() -> None:
    with pytest.raises(ValueError, match="outside"):
        fit_elo([("random", "a", 2.0)])


games_strategy = st.lists(
    st.tuples(st.sampled_from(["random", "a", "b", "c"]), st.sampled_from(["random", "a", "b", "c"]),
              st.sampled_from([0.0, 0.5, 1.0])),
    min_size=1, max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(games_strategy, st.randoms(use_true_random=False))
def test_order_and_orientation_do_not_matter(games: list, rnd) -> None:
    shuffled = list(games)
    rnd.shuffle(shuffled)
    flipped = [(b, a, 1.0 - s) for a, b, s in shuffled]
    one, two = fit_elo(games), fit_elo(flipped)
    assert set(one.ratings) == set(two.ratings)
    for name, r in one.ratings.items():
        assert two.ratings[name].elo == pytest.approx(r.elo, abs=1e-6)
        assert r.low <= r.elo <= r.high
    assert pair_counts(games) == pair_counts([(a, b, s) for a, b, s in games])


def test_a_chain_that_never_played_the_anchor_is_rated_from_its_first_player() -> None:
    """The default run: no gate, so each candidate plays only the previous best and nobody
    plays random. fit_elo leaves them all unrated; fit_elo_chains rates the chain, its first
    generation at 0, the later ones by their games, each with an interval."""
    rng = np.random.default_rng(3)
    truth = {"g1": 0.0, "g2": 120.0, "g3": 260.0}
    games = [g for a, b in (("g2", "g1"), ("g3", "g2")) for g in simulate(rng, {a: truth[a], b: truth[b]}, 200)]
    assert fit_elo(games).unrated == ["g1", "g2", "g3"]
    fit = fit_elo_chains(games, order=["g1", "g2", "g3"])
    assert fit.unrated == [] and fit.anchor_of["g2"] == "g1" and fit.ratings["g1"].elo == 0.0
    for name in ("g2", "g3"):
        r = fit.ratings[name]
        assert r.low <= truth[name] <= r.high and r.high - r.low < 200, (name, r)
    assert fit.ratings["g1"].elo < fit.ratings["g2"].elo < fit.ratings["g3"].elo


def test_chains_keep_the_anchor_where_it_is_reached() -> None:
    """A player connected to random is rated against random (as fit_elo rates it); a separate
    chain is anchored apart, at its first player in the order given."""
    rng = np.random.default_rng(5)
    anchored = simulate(rng, {"random": 0.0, "a": 300.0}, 100)
    apart = simulate(rng, {"x": 0.0, "y": 200.0}, 100)
    fit = fit_elo_chains(anchored + apart, order=["y", "x"])
    assert fit.ratings["a"] == fit_elo(anchored).ratings["a"] and fit.anchor_of["a"] == "random"
    assert fit.anchor_of["x"] == "y" and fit.ratings["y"].elo == 0.0 and fit.ratings["x"].elo < 0


def test_a_match_summary_fits_like_its_games() -> None:
    """(a, b, total score, games) rows: the same fit as the games one by one, so a cluster's
    records (wins, draws, losses per match) are never expanded, however many games they count."""
    games = [("x", "random", 1.0)] * 14 + [("x", "random", 0.5)] * 2 + [("x", "random", 0.0)] * 4 \
        + [("y", "x", 1.0)] * 9 + [("y", "x", 0.0)] * 11
    summary = [("x", "random", 15.0, 20.0), ("y", "x", 9.0, 20.0)]
    by_game, by_match = fit_elo(games), fit_elo(summary)
    for name in ("x", "y"):
        assert by_match.ratings[name].elo == pytest.approx(by_game.ratings[name].elo)
        assert by_match.ratings[name].low == pytest.approx(by_game.ratings[name].low)
    with pytest.raises(ValueError):
        fit_elo([("x", "random", 21.0, 20.0)])


def test_chain_anchors_name_what_each_rating_is_relative_to() -> None:
    from app.games.train.elo import chain_anchors

    games = [("a", "random", 1.0), ("b", "a", 0.5), ("c", "d", 1.0), ("e", "d", 0.0)]
    anchors = chain_anchors(games, order=["d", "c", "e"])
    assert anchors == {"random": "random", "a": "random", "b": "random", "c": "d", "d": "d", "e": "d"}
    fitted = fit_elo_chains(games, order=["d", "c", "e"]).anchor_of
    assert fitted == anchors  # the same anchors the fit rates them against
