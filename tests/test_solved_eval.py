"""The solver-scored benchmark: reading move_scores.txt, scoring choices, the raw network and
MCTS as players, the CLI, and the learning bench's own pieces (CPU sampling of a process
tree, the plot)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config.pipeline import SearchConfig
from app.games import get_game
from app.games.train.solved_eval import (
    ScoredPosition, SolvedEvalError, accuracy, coverage, default_positions_path, load_positions, mcts_choices,
    WIN_ON_THE_SPOT, network_choices, parse_line, random_mover_accuracy, score_model, seen_in, value_choices,
)
from tests.conftest import REPO

GAME = get_game("connect4")
# Pons position where column 6 wins at once (tests/test_analyze.py); other columns lose or draw.
WIN_NOW = "2433354242571"


def load_bench_script():
    spec = importlib.util.spec_from_file_location("bench_learning_cli", REPO / "scripts" / "bench_learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.fixture(scope="module")
def tiny_net():
    return new_model(Architecture(8, 1, GAME.plane_shape, GAME.num_actions), seed=0)


def test_the_shared_file_is_found_beside_the_repo_and_reads_whole() -> None:
    path = default_positions_path(REPO)
    assert path == REPO.parent / "shared" / "benchmarks" / "connect4" / "move_scores.txt"
    positions = load_positions(path)
    assert len(positions) == 931
    assert all(4 <= p.ply <= 32 for p in positions)
    # README: a uniform random mover scores about 30 % exact and 67 % outcome
    floor = random_mover_accuracy(positions)
    assert 0.25 <= floor["exact"] <= 0.35 and 0.6 <= floor["outcome"] <= 0.72


def test_missing_or_malformed_files_are_refused_by_path_and_line(tmp_path: Path) -> None:
    with pytest.raises(SolvedEvalError, match=r"move_scores.txt: solved move scores not found .*shared/benchmarks"):
        load_positions(tmp_path / "move_scores.txt")
    bad = tmp_path / "bad.txt"
    bad.write_text("4453 1 2 3 4 5 6 7\n44 1 2\n")
    with pytest.raises(SolvedEvalError, match=r"bad.txt:2: expected a move string and 7 scores"):
        load_positions(bad)
    bad.write_text("4444444 1 2 3 4 5 6 7\n")  # column 4 is full, but scored
    with pytest.raises(SolvedEvalError, match=r"bad.txt:1: move 7 .* is illegal"):
        load_positions(bad)
    bad.write_text("444444 1 2 3 4 5 6 7\n")  # column 4 is full after six stones: must be None
    with pytest.raises(SolvedEvalError, match=r"bad.txt:1: scores name other columns full"):
        load_positions(bad)
    bad.write_text("44x 1 2 3 4 5 6 7\n")
    with pytest.raises(SolvedEvalError, match=r"bad.txt:1: bad character"):
        load_positions(bad)
    bad.write_text("\n")
    with pytest.raises(SolvedEvalError, match=r"bad.txt: no positions"):
        load_positions(bad)


def test_exact_and_outcome_follow_the_solver_scores() -> None:
    p = parse_line("44 -2 3 3 None 0 -1 1")  # column 4 full; best 3 (cols 2, 3)
    assert p.scores[3] is None and p.best == 3
    assert p.is_exact(1) and p.is_exact(2) and not p.is_exact(6)
    assert p.keeps_outcome(6) and not p.keeps_outcome(4) and not p.keeps_outcome(0)  # win kept; draw, loss not
    with pytest.raises(SolvedEvalError, match="column 4 is full"):
        p.is_exact(3)
    draw = ScoredPosition("4", (-1, 0, 0, 0, -2, -1, -3))
    assert draw.keeps_outcome(1) and not draw.keeps_outcome(0)
    report = accuracy([p, draw], [6, 1])
    assert (report["exact"], report["outcome"]) == (0.5, 1.0)
    assert report["by_phase"]["opening"]["positions"] == 2
    # the won position kept its win too slowly (column 7 scores 1, the best 3); the draw is exact
    assert report["by_result"] == {"won": {"positions": 1, "exact": 0.0, "outcome": 1.0},
                                   "drawn": {"positions": 1, "exact": 1.0, "outcome": 1.0}}
    assert report["misses"] == {"result": 0, "one_step": 0, "further": 1}  # 1 against the best 3
    won = ScoredPosition("4", (2, 3, 1, -1, 3, 2, 0))  # best 3
    lost = ScoredPosition("4", (-3, -2, -4, -2, -5, -3, -6))  # best -2: lose as late as can be
    kinds = accuracy([won, won, won, lost, lost], [0, 2, 3, 0, 1])["misses"]
    assert kinds == {"result": 1, "one_step": 2, "further": 1}  # 2 for 3 and -3 for -2 are one step off
    assert random_mover_accuracy([p]) == {"positions": 1, "exact": round(2 / 6, 4), "outcome": round(3 / 6, 4)}
    with pytest.raises(ValueError, match="1 choices for 2 positions"):
        accuracy([p, draw], [1])


def test_the_raw_network_plays_its_policy_argmax_and_search_finds_a_win(tiny_net) -> None:
    positions = load_positions(default_positions_path(REPO))[:40]
    choices = network_choices(tiny_net, positions, batch=16)  # batching changes nothing
    assert choices == network_choices(tiny_net, positions, batch=40)
    from app.games.search.model import predict
    for p, c in zip(positions[:5], choices):
        state = GAME.parse(p.moves)
        probs, _ = predict(tiny_net, state.planes()[None], state.legal_mask()[None])
        assert c == int(np.argmax(probs[0])) and p.scores[c] is not None
    win = ScoredPosition(WIN_NOW, tuple(None if not legal else (9 if a == 5 else -5)
                                        for a, legal in enumerate(GAME.parse(WIN_NOW).legal_mask())))
    assert mcts_choices(tiny_net, [win] * 3, 64, SearchConfig(), batch=2) == [5, 5, 5]
    report = score_model(tiny_net, positions, [0, 16])
    assert set(report) == {"positions", "raw", "value", "mcts"} and set(report["mcts"]) == {"16"}
    assert report["value"]["exact"] == accuracy(positions, value_choices(tiny_net, positions))["exact"]
    assert 0 <= report["raw"]["exact"] <= 1 and 0 <= report["mcts"]["16"]["outcome"] <= 1
    assert report["raw"]["exact"] == accuracy(positions, choices)["exact"]
    with pytest.raises(ValueError, match="simulations must be >= 0"):
        score_model(tiny_net, positions, [-1])


def test_value_choices_rank_moves_by_the_value_head_one_ply_deep(tiny_net) -> None:
    from app.games.search.model import predict
    positions = load_positions(default_positions_path(REPO))
    choices = value_choices(tiny_net, positions)
    for p, c in zip(positions[:40], choices):  # the mover's value of each child, asked one at a time
        state = GAME.parse(p.moves)
        worth = {}
        for move in state.legal_moves():
            child = state.play(move)
            if child.is_terminal:
                worth[move] = WIN_ON_THE_SPOT if child.winner is not None else 0.0
            else:
                worth[move] = -float(predict(tiny_net, child.planes()[None], child.legal_mask()[None])[1][0])
        assert worth[c] == pytest.approx(max(worth.values()), abs=1e-5)
    # a move that wins on the spot is always taken, whatever the untrained value head says
    winning = [(p, c) for p, c in zip(positions, choices) if GAME.parse(p.moves).winning_moves()]
    assert len(winning) > 50
    assert all(c in GAME.parse(p.moves).winning_moves() and p.is_exact(c) for p, c in winning)


@pytest.mark.timeout(120)
def test_cli_prints_one_json_object_and_fails_cleanly(tmp_path: Path, tiny_net) -> None:
    model = tmp_path / "m.safetensors"
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    save_model(tiny_net, ModelMeta(arch, GAME.name, generation=3), model)
    proc = subprocess.run([sys.executable, "scripts/solved_eval.py", "--model", str(model), "--sims", "0,8",
                           "--limit", "30"], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["generation"] == 3 and report["positions"] == 30
    assert report["raw"]["positions"] == 30 and report["mcts"]["8"]["positions"] == 30
    assert report["value"]["positions"] == 30
    missing = subprocess.run([sys.executable, "scripts/solved_eval.py", "--model", str(model), "--positions",
                              str(tmp_path / "nowhere.txt")], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert missing.returncode == 2
    assert "nowhere.txt: solved move scores not found" in missing.stderr and "Traceback" not in missing.stderr


def game_through(moves: str, seed: int = 0):
    """A finished game record that passes through the Pons position `moves` (random moves after it)."""
    from app.db.replay_db import GameRecord, MoveRecord

    rng = np.random.default_rng(seed)
    state, played = GAME.initial_state(), [int(c) - 1 for c in moves]
    for move in played:
        state = state.play(move)
    while not state.is_terminal:
        legal = state.legal_moves()
        played.append(int(legal[rng.integers(len(legal))]))
        state = state.play(played[-1])
    uniform = [1.0 / GAME.num_actions] * GAME.num_actions
    return GameRecord(uid=f"through-{moves}", game=GAME.name, moves=[MoveRecord(m, uniform) for m in played],
                      winner=state.winner, finished_at=1.0)


def test_coverage_splits_accuracy_by_what_the_dataset_holds(tmp_path: Path, tiny_net) -> None:
    from app.db.replay_db import ReplayDB
    from app.games.train.export import export_dataset

    positions = load_positions(default_positions_path(REPO))[:40]
    planes = np.stack([GAME.parse(p.moves).planes() for p in positions[:3]])
    seen = seen_in(positions, planes)
    assert seen[:3] == [True] * 3 and sum(seen) == 3
    choices = network_choices(tiny_net, positions)
    split = coverage(positions, choices, seen)
    assert split["positions_seen"] == 3 and split["seen"]["positions"] == 3 and split["unseen"]["positions"] == 37
    assert split["seen"]["exact"] == accuracy(positions[:3], choices[:3])["exact"]
    with pytest.raises(ValueError, match="40 positions, 40 choices, 2 seen flags"):
        coverage(positions, choices, seen[:2])
    # the CLI: a dataset exported from a game through the first two positions
    with ReplayDB(tmp_path / "games.db") as db:
        for i, p in enumerate(positions[:2]):
            db.add_game(game_through(p.moves, seed=i))
    export_dataset([tmp_path / "games.db"], tmp_path / "ds", holdout_fraction=0.0, augment=False)
    model = tmp_path / "m.safetensors"
    save_model(tiny_net, ModelMeta(Architecture(8, 1, GAME.plane_shape, GAME.num_actions), GAME.name), model)
    cmd = [sys.executable, "scripts/solved_eval.py", "--model", str(model), "--sims", "0", "--limit", "40"]
    proc = subprocess.run(cmd + ["--dataset", str(tmp_path / "ds")], cwd=REPO, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["coverage"]
    assert report["positions_seen"] >= 2 and report["seen"]["positions"] + report["unseen"]["positions"] == 40
    missing = subprocess.run(cmd + ["--dataset", str(tmp_path / "nowhere")], cwd=REPO, capture_output=True,
                             text=True, timeout=100)
    assert missing.returncode == 2 and "nowhere" in missing.stderr and "Traceback" not in missing.stderr


def test_cpu_of_a_process_tree_counts_live_and_reaped_children() -> None:
    bench = load_bench_script()
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\n"
    # a parent that first reaps one burning child, then keeps a second one burning while we look
    script = ("import subprocess, sys, time\n"
              f"subprocess.run([sys.executable, '-c', {burn!r}])\n"
              "p = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
              "print(p.pid, flush=True)\n"
              "p.wait()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = None
    try:
        child = int(proc.stdout.readline())  # type: ignore[union-attr]
        first = bench.tree_cpu_seconds(proc.pid)
        assert first >= 0.5  # the reaped child's 0.6 s (clock ticks round down a little)
        deadline = time.time() + 60
        while bench.tree_cpu_seconds(proc.pid) < first + 0.2:  # the live grandchild burns on
            assert time.time() < deadline, "the live child's CPU time was not counted"
            time.sleep(0.1)
    finally:
        if child is not None:
            os.kill(child, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(20)
    sampler = bench.CpuSampler()
    sampler.samples = [(10.0, 5.0), (20.0, 9.0)]
    assert sampler.at(15.0) == pytest.approx(7.0) and sampler.at(30.0) == 9.0


def test_the_learning_plot_is_a_png(tmp_path: Path) -> None:
    bench = load_bench_script()
    curve = [{"generation": 0, "wall_s": 0.0, "cpu_s": 0.0, "raw_exact": 0.2, "raw_outcome": 0.6,
              "mcts_exact": 0.4, "mcts_outcome": 0.7},
             {"generation": 1, "wall_s": 300.0, "cpu_s": 550.0, "raw_exact": 0.5, "raw_outcome": 0.8,
              "mcts_exact": 0.7, "mcts_outcome": 0.9}]
    out = tmp_path / "curve.png"
    assert bench.plot_curves(curve, out, "test", 400)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*tmp"))


def test_the_bench_finds_every_model_that_was_promoted_in_order(tmp_path: Path, tiny_net) -> None:
    from app.db.registry import ModelRegistry
    from app.games.train.promotion import promote_model, register_candidate, reject_model

    bench = load_bench_script()
    assert bench.promoted_models(tmp_path) == ([], 0, 0)  # no registry yet: an empty curve, no error
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    paths = []
    for generation in (1, 2, 3):
        path = tmp_path / "models" / f"g{generation}.safetensors"
        path.parent.mkdir(exist_ok=True)
        save_model(new_model(arch, seed=generation), ModelMeta(arch, GAME.name, generation=generation), path)
        paths.append(path)
    with ModelRegistry(tmp_path / "registry.db") as registry:
        first, second, third = (register_candidate(registry, p) for p in paths)
        promote_model(registry, first.sha256, "gate passed")
        reject_model(registry, second.sha256, "sprt rejected")
        promote_model(registry, third.sha256, "gate passed")
    promoted, n_promoted, n_rejected = bench.promoted_models(tmp_path)
    assert [m.generation for m in promoted] == [1, 3]  # both ever promoted, oldest first
    assert (n_promoted, n_rejected) == (2, 1)  # a superseded best stays "promoted", as bench_loop counts it
    report = score_model(tiny_net, load_positions(default_positions_path(REPO))[:20], [0, 4])
    point = bench.curve_point(report, 4)
    assert point["raw_exact"] == report["raw"]["exact"] and point["mcts_exact"] == report["mcts"]["4"]["exact"]
    assert "mcts_exact" not in bench.curve_point(report, 0)
    misses = point["mcts_misses"]
    assert sum(misses.values()) == round(20 * (1 - point["mcts_exact"]))  # every miss is of one kind
    assert point["value_exact"] == report["value"]["exact"]
