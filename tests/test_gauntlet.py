"""Gauntlet: openings, colours, recording, SPRT early stop and cap, worker processes, the CLI."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import load_settings
from app.db.registry import ModelRegistry
from app.games import get_game
from app.games.train.gauntlet import format_table, run_gauntlet
from app.games.train.match_games import make_openings

REPO = Path(__file__).resolve().parent.parent
GAME = get_game("connect4")


def fast_settings(**gauntlet):
    return load_settings(None, gauntlet={"opening_plies_min": 2, "opening_plies_max": 4, "net_simulations": 4,
                                         **gauntlet})


def run_cli(script: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, cwd=REPO)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_openings_are_distinct_undecided_and_in_range() -> None:
    openings = make_openings(GAME, 100, 2, 4, np.random.default_rng(0))
    assert len(set(openings)) == 100
    for opening in openings:
        assert 2 <= len(opening) <= 4
        state = GAME.initial_state()
        for a in opening:
            state = state.play(a)
        assert not state.is_terminal
    # A game with fewer openings than asked repeats rather than fails.
    assert len(make_openings(GAME, 60, 1, 1, np.random.default_rng(0))) == 60


def test_every_game_is_recorded_with_colours_alternated(tmp_path: Path) -> None:
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        report = run_gauntlet("heuristic:1", ["random"], None, fast_settings(), registry, workers=1,
                              seed=5, games_per_baseline=10)
        games = registry.match_games(report.match_id)
        stored = registry.ratings()
    [result] = report.results
    assert (result.kind, result.games, result.stopped) == ("random", 10, "fixed")
    assert result.wins >= 9 and result.score >= 0.9
    assert len(games) == 10
    first_movers = [g.player0 for g in sorted(games, key=lambda g: int(g.uid.rsplit("-", 1)[1]))]
    assert first_movers == ["heuristic-d1", "random"] * 5
    openings = [g.moves[:g.opening_plies] for g in sorted(games, key=lambda g: int(g.uid.rsplit("-", 1)[1]))]
    assert all(openings[i] == openings[i + 1] for i in range(0, 10, 2))  # a pair shares its opening
    assert len(set(openings)) == 5  # and pairs differ
    assert len({g.moves for g in games}) == 10  # so no two games are the same game
    for g in games:
        state = GAME.parse(g.moves)
        assert state.is_terminal and state.winner == g.winner
    names = {r.player for r in report.ratings}
    assert names == {"heuristic-d1", "random"} == {r.player for r in stored}
    assert report.ratings[0].player == "heuristic-d1" and report.ratings[0].elo > 0


def test_a_three_player_gauntlet_stores_every_seat_and_rates_from_seat_pairs(tmp_path: Path) -> None:
    """mnk3: the candidate takes each seat in turn against the field; a game is stored with each
    seat's player and return and counted as the candidate's two seat pairs, by the tally and by
    the Elo fit alike (before: one candidate-vs-field result a game, and a game the candidate
    lost to one seat while level with the other was counted nowhere)."""
    settings = load_settings(None, node={"game": "mnk3"},
                             gauntlet={"opening_plies_min": 1, "opening_plies_max": 2})
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        report = run_gauntlet("heuristic:1", ["random"], None, settings, registry, workers=1, seed=3,
                              games_per_baseline=6)
        games = sorted(registry.match_games(report.match_id), key=lambda g: int(g.uid.rsplit("-", 1)[1]))
        pairs = registry.match_results()
    [result] = report.results
    assert len(games) == 6 and result.games == 12  # every game, two seat pairs each
    assert all(len(g.seats) == 3 and {p for p, _ in g.seats} == {"heuristic-d1", "random"} for g in games)
    assert [[p for p, _ in g.seats].index("heuristic-d1") for g in games] == [0, 1, 2] * 2
    assert len(pairs) == 12 and all({a, b} == {"heuristic-d1", "random"} for a, b, _ in pairs)
    points = sum(s if a == "heuristic-d1" else 1.0 - s for a, _, s in pairs)
    assert result.wins + 0.5 * result.draws == pytest.approx(points)
    assert {r.player: r.games for r in report.ratings}["heuristic-d1"] == 12


def test_sprt_stops_a_lopsided_match_early(tmp_path: Path) -> None:
    settings = fast_settings(max_games_vs_best=200, sprt_elo0=0.0, sprt_elo1=35.0)
    report = run_gauntlet("heuristic:2", [], "random", settings, tmp_path / "reg.sqlite", workers=1, seed=1)
    best = report.result("best")
    assert best is not None and best.stopped == "sprt"
    assert best.sprt.decision.value == "accept"
    assert best.games < 60
    assert "accept" in format_table(report)


def test_an_undecided_match_runs_to_the_cap(tmp_path: Path) -> None:
    settings = fast_settings(max_games_vs_best=6)
    report = run_gauntlet("heuristic:1", [], "heuristic:2", settings, tmp_path / "reg.sqlite", workers=1, seed=2)
    best = report.result("best")
    assert (best.stopped, best.games, best.sprt.decision.value) == ("cap", 6, "continue")


@pytest.mark.timeout(180)
def test_worker_processes_play_the_games(tmp_path: Path) -> None:
    report = run_gauntlet("heuristic:1", ["random"], None, fast_settings(), tmp_path / "reg.sqlite",
                          workers=2, seed=3, games_per_baseline=6)
    assert report.results[0].games == 6
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        assert len(registry.match_games(report.match_id)) == 6


@pytest.mark.timeout(180)
def test_cli_prints_the_table_for_a_model_candidate(tmp_path: Path) -> None:
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    model = tmp_path / "cand.safetensors"
    meta = save_model(new_model(arch, seed=1), ModelMeta(arch, "connect4"), model)
    config = tmp_path / "node.yaml"
    config.write_text("gauntlet:\n  net_simulations: 4\n  heuristic_depth: 1\n")
    proc = run_cli("run_gauntlet.py", "--candidate", str(model), "--baselines", "random,heuristic",
                   "--games", "4", "--workers", "1", "--config", str(config),
                   "--registry", str(tmp_path / "reg.sqlite"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    for needle in ("opponent", "W", "D", "L", "score", "random", "heuristic-d1", "Elo", "low", "high",
                   f"model:{meta.sha256[:12]}:s4"):
        assert needle in out, f"{needle!r} missing from:\n{out}"


def test_cli_bad_input_is_a_clear_error(tmp_path: Path, capsys) -> None:
    proc = run_cli("run_gauntlet.py", "--candidate", "grandmaster", "--registry", str(tmp_path / "r.sqlite"))
    assert proc.returncode == 2
    assert "unknown player" in proc.stderr and "Traceback" not in proc.stderr
    spec = importlib.util.spec_from_file_location("run_gauntlet_cli", REPO / "scripts" / "run_gauntlet.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    assert module.main(["--candidate", "random", "--best", "current", "--registry", str(tmp_path / "r.sqlite")]) == 2
    assert "no promoted model" in capsys.readouterr().err
    assert module.main(["--candidate", "heuristic:1", "--baselines", "random", "--games", "2", "--json",
                        "--quiet", "--registry", str(tmp_path / "r.sqlite")]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["results"][0]["games"] == 2 and report["ratings"]


def test_should_stop_ends_the_gauntlet_between_rounds_keeping_finished_games(tmp_path: Path) -> None:
    from app.games.train.gauntlet import GauntletStopped
    from app.games.train.match_games import MAX_WAVE

    calls = []

    def stop_after_three() -> bool:
        calls.append(1)
        return len(calls) > 3

    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        with pytest.raises(GauntletStopped):
            run_gauntlet("heuristic:1", ["random"], None, fast_settings(), registry, workers=1,
                         seed=5, games_per_baseline=40, should_stop=stop_after_three)
        games = registry.match_games()
    assert 0 < len(games) < MAX_WAVE  # stopped inside the first wave: its finished games only
    for g in games:
        assert GAME.parse(g.moves).is_terminal


def test_a_match_is_played_in_waves_whose_network_calls_are_batches(tmp_path: Path) -> None:
    """One worker plays all of a small match's games in lock step: each network call carries a
    leaf of every game still running, not one position. The SPRT still counts every game."""
    from app.games.train import match_games

    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    candidate, best = tmp_path / "candidate.safetensors", tmp_path / "best.safetensors"
    save_model(new_model(arch, seed=1), ModelMeta(arch, "connect4", generation=1), candidate)
    save_model(new_model(arch, seed=2), ModelMeta(arch, "connect4", generation=0), best)
    match_games._PLAYER_CACHE.clear()
    settings = fast_settings(max_games_vs_best=8)
    report = run_gauntlet(candidate, [], best, settings, tmp_path / "reg.sqlite", workers=1, seed=4)
    result = report.result("best")
    assert (result.games, result.stopped) == (8, "cap")
    players = [p for p in match_games._PLAYER_CACHE.values() if hasattr(p, "evaluator")]
    assert len(players) == 2
    for player in players:
        evaluator = player.evaluator
        assert evaluator.positions / evaluator.batches > 3.0  # 4 games a side in each call at first
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        games = registry.match_games(report.match_id)
    assert len(games) == 8 and len({g.moves for g in games}) == 8
    for g in games:
        state = GAME.parse(g.moves)
        assert state.is_terminal and state.winner == g.winner
    match_games._PLAYER_CACHE.clear()


def test_waves_keep_opening_pairs_together_and_split_over_workers() -> None:
    from app.games.train.match_games import MAX_WAVE, GameTask, cut_waves
    from app.games.search.players import PlayerSpec

    spec = PlayerSpec("random")
    tasks = [GameTask(i, spec, spec, i % 2, (), i) for i in range(40)]
    assert [len(w) for w in cut_waves(tasks, 1)] == [MAX_WAVE, 40 - MAX_WAVE]
    assert [len(w) for w in cut_waves(tasks[:20], 1)] == [20]
    assert [len(w) for w in cut_waves(tasks[:20], 3)] == [8, 8, 4]  # 7 rounded up to whole pairs
    assert [len(w) for w in cut_waves(tasks[:5], 8)] == [2, 2, 1]
    assert [t.index for w in cut_waves(tasks, 4) for t in w] == list(range(40))


def test_a_one_worker_gauntlet_plays_on_one_torch_thread(tmp_path: Path) -> None:
    """Inline games (the orchestrator's own process) must not run on several torch threads:
    batch-of-one network calls then spin for a core that a neighbour process holds."""
    code = (
        "import sys, torch\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "torch.set_num_threads(3)\n"
        "from app.config import load_settings\n"
        "from app.games.train.gauntlet import run_gauntlet\n"
        "settings = load_settings(None, gauntlet={'opening_plies_min': 2, 'opening_plies_max': 4})\n"
        f"run_gauntlet('heuristic:1', ['random'], None, settings, {str(tmp_path / 'reg.sqlite')!r},"
        " workers=1, seed=1, games_per_baseline=2)\n"
        "print('threads', torch.get_num_threads())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "threads 1"


def test_a_chain_of_best_matches_rates_every_generation(tmp_path: Path) -> None:
    """No gate configured: generation 1 plays nothing, each later candidate only the previous
    best. Every generation still gets an Elo with its interval, the first at 0, from the
    games recorded in the registry."""
    from app.db.registry import MatchGame
    from app.games.train.gauntlet import recompute_ratings

    shas = [f"{g:064x}" for g in (1, 2, 3)]
    player = lambda sha: f"model:{sha}:s4"  # noqa: E731
    with ModelRegistry(tmp_path / "registry.db") as registry:
        for g, sha in enumerate(shas, 1):
            registry.register(sha, f"/m/{g}", g, shas[g - 2] if g > 1 else None)
        for g in (2, 3):  # candidate g vs best g-1: the candidate wins 14 of 20
            registry.add_match_games([
                MatchGame(f"m{g}-{i}", f"m{g}", "connect4", player(shas[g - 1]), player(shas[g - 2]),
                          0 if i < 14 else 1, "44", 2) for i in range(20)])
        recompute_ratings(registry, net_simulations=4)
        models = {m.generation: m for m in registry.models()}
    assert models[1].elo == 0.0
    assert 0 < models[2].elo < models[3].elo
    assert all(models[g].elo_low < models[g].elo < models[g].elo_high for g in (2, 3))
