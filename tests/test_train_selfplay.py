"""End to end: uniform-prior MCTS self-play -> export -> torchrun training -> a network that
beats a random player in at least 90 % of games, playing both colours.

The network plays by a one-ply search: it expands every legal move once and picks the child
its value head likes least for the opponent (terminal children are valued by the rules, as in
MCTS). That is the cheapest form of "a few simulations", one batched forward per move. The
raw policy argmax is not used: from uniform-prior search targets it learns wins and blocks
but little else, and an untrained net's argmax (always the same column) already beats random
~80 % of the time, so it would not show what training added. The test therefore also plays
the same player with the untrained network and requires a clear gain.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.ai.model import ModelMeta, load_model, new_model, predict
from app.config import Settings
from app.games import GameState, get_game
from app.training.export import export_dataset
from app.training.launcher import LaunchSpec, launch
from app.training.selfplay import run_selfplay

GAMES = 1000
SIMULATIONS = 32
EVAL_GAMES = 200


def one_ply_move(net: torch.nn.Module, state: GameState) -> int:
    moves = state.legal_moves()
    children = [state.play(a) for a in moves]
    values = np.empty(len(moves))
    open_idx = [i for i, c in enumerate(children) if not c.is_terminal]
    for i, child in enumerate(children):
        if child.is_terminal:
            values[i] = child.terminal_value()  # from the opponent's view: -1 when we just won
    if open_idx:
        _, v = predict(net, np.stack([children[i].planes() for i in open_idx]))
        values[open_idx] = v
    return moves[int(np.argmin(values))]


def score_vs_random(net: torch.nn.Module, games: int, seed: int) -> float:
    """Share of games won by the network, which plays first in even games, second in odd."""
    game = get_game("connect4")
    rng = np.random.default_rng(seed)
    wins = 0
    for g in range(games):
        side = g % 2
        state = game.initial_state()
        while not state.is_terminal:
            move = one_ply_move(net, state) if state.to_move == side else int(rng.choice(state.legal_moves()))
            state = state.play(move)
        wins += state.winner == side
    return wins / games


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_network_trained_on_selfplay_beats_random(tmp_path: Path):
    torch.set_num_threads(1)
    summary = run_selfplay(games=GAMES, simulations=SIMULATIONS, db_path=tmp_path / "games.db", workers=0,
                           seed=11, node_id="test", settings=Settings())
    assert summary.games == GAMES
    export = export_dataset([tmp_path / "games.db"], tmp_path / "ds", window_games=GAMES, holdout_fraction=0.05)
    run_dir = tmp_path / "run"
    launch(LaunchSpec(
        target=["-m", "app.training.train", "--dataset", str(tmp_path / "ds"), "--run-dir", str(run_dir),
                "--channels", "32", "--blocks", "2", "--batch-size", "256", "--lr", "0.003", "--epochs", "3",
                "--eval-every", "100000", "--log-every", "50", "--seed", "1"],
        nproc=1, log_dir=run_dir / "logs", timeout_s=300, status_every_s=0), out=io.StringIO())
    result = json.loads((run_dir / "result.json").read_text())
    assert result["dataset_sha256"] == export.dataset_sha256
    trained, meta = load_model(run_dir / "candidate.safetensors", expect_game="connect4")
    untrained = new_model(meta.architecture, seed=1)
    trained_score = score_vs_random(trained, EVAL_GAMES, seed=5)
    untrained_score = score_vs_random(untrained, EVAL_GAMES, seed=5)
    print(f"trained {trained_score:.3f} untrained {untrained_score:.3f} ({GAMES} games x {SIMULATIONS} sims)")
    assert trained_score >= 0.9, (trained_score, untrained_score)
    assert trained_score >= untrained_score + 0.05, (trained_score, untrained_score)
    assert isinstance(meta, ModelMeta) and meta.dataset_sha256 == export.dataset_sha256
