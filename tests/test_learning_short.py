"""CI's guard on learning itself: self-play -> export -> torchrun training must yield a network
that picks perfect-play moves on the solver-scored positions clearly more often than the
same network untrained.

Kept to a couple of minutes on two busy cores: 60 self-play games of 24 simulations whose
leaves are valued by random playouts (vectorised, so cheap) instead of a network. Uniform-prior
search with zero leaf values (tests/test_train_selfplay.py) only teaches immediate wins and
blocks, which too few of these positions hinge on for a small run to show; playout values
give targets with a real preference (centre columns, threats), so a break anywhere in the
targets, the export, the loss or the trainer shows as a collapse of the margin. Seeds are
fixed throughout and the export keeps no holdout games (the holdout split hashes the games'
random uids), so every run trains the same network: trained 0.412 exact vs untrained 0.188 (a
random mover: 0.279). With a uid-chosen holdout it moved between 0.406 and 0.432.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from app.games.search.evaluators import RolloutEvaluator
from app.games.search.model import load_model, new_model
from app.config import Settings
from app.db.replay_db import ReplayDB
from app.games import get_game
from app.games.train.export import export_dataset
from app.shared.launcher import LaunchSpec, launch
from app.games.train.selfplay import play_games
from app.games.train.solved_eval import default_positions_path, load_positions, random_mover_accuracy, score_model
from tests.conftest import REPO

GAMES = 60
SIMULATIONS = 24
ROLLOUTS_PER_LEAF = 8
MARGIN = 0.10  # exact-move accuracy the trained network must gain over its untrained self


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_briefly_trained_network_beats_its_untrained_self(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    positions = load_positions(default_positions_path(REPO))
    game = get_game("connect4")
    rng = np.random.default_rng(11)
    with ReplayDB(tmp_path / "games.db") as db:
        for record in play_games(GAMES, RolloutEvaluator(game, ROLLOUTS_PER_LEAF, rng), Settings(),
                                 SIMULATIONS, rng, node_id="test"):
            assert db.add_game(record)
        assert db.count() == GAMES
    export = export_dataset([tmp_path / "games.db"], tmp_path / "ds", window_games=GAMES, holdout_fraction=0.0)
    run_dir = tmp_path / "run"
    launch(LaunchSpec(
        target=["-m", "app.games.train.train", "--dataset", str(tmp_path / "ds"), "--run-dir", str(run_dir),
                "--channels", "16", "--blocks", "2", "--batch-size", "128", "--lr", "0.005", "--epochs", "3",
                "--eval-every", "100000", "--log-every", "50", "--seed", "1"],
        nproc=1, log_dir=run_dir / "logs", timeout_s=360, status_every_s=0), out=io.StringIO())
    result = json.loads((run_dir / "result.json").read_text())
    assert result["dataset_sha256"] == export.dataset_sha256
    trained, meta = load_model(run_dir / "candidate.safetensors", expect_game="connect4")
    untrained = new_model(meta.architecture, seed=1)  # the weights training started from
    after = score_model(trained, positions)["raw"]
    before = score_model(untrained, positions)["raw"]
    floor = random_mover_accuracy(positions)
    print(f"exact: trained {after['exact']:.3f} untrained {before['exact']:.3f} random {floor['exact']:.3f}")
    assert after["exact"] >= before["exact"] + MARGIN, (after, before)
    assert after["exact"] > floor["exact"], (after, floor)  # better than no idea at all
    assert after["outcome"] > before["outcome"], (after, before)
