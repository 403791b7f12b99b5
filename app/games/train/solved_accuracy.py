"""How close each promoted model's raw network plays to perfect, kept per model on disk.

Where the game ships solver-scored positions (`Game.scored_positions`, the format of
solved_eval.py), a promoted model's policy argmax is scored once: exact-move accuracy (the
solver's best move) and outcome accuracy (a move that keeps the position's result). One
batched forward pass over 931 positions, well under a second on a CPU core; the result is
written to `<data_dir>/solved_accuracy.json` by sha256, so it is computed once per model and
node, and read by /progress and the dashboard without touching the network again.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from app.atomic_files import atomic_write_json
from app.games import DEFAULT_GAME, get_game
from app.games.train.solved_eval import ScoredPosition, accuracy, default_positions_path, network_choices

ACCURACY_FILE = "solved_accuracy.json"
REPO_ROOT = Path(__file__).resolve().parents[3]
MODELS_KEPT = 1000  # newest entries kept in the file


def positions_file(configured: Path | None, game_name: str = DEFAULT_GAME) -> Path | None:
    """The configured file, or the game's scored set beside the repository (None: the game
    ships none, and no panel is shown)."""
    return Path(configured) if configured is not None else default_positions_path(REPO_ROOT, get_game(game_name))


def score_raw_network(model_path: str | Path, positions: list[ScoredPosition], game_name: str,
                      sha256: str | None = None) -> dict[str, float]:
    """{"exact", "outcome", "positions"} of the model's policy argmax on `positions` (with
    `sha256`: the file must be that model, or ModelFormatError)."""
    from app.games.search.model import load_model  # torch, only for a node that scores a model

    game = get_game(game_name)
    net, _ = load_model(model_path, expect_game=game.name, expect_sha256=sha256)
    report = accuracy(positions, network_choices(net, positions, game))
    return {"exact": report["exact"], "outcome": report["outcome"], "positions": report["positions"]}


class AccuracyCache:
    """sha256 -> {"exact", "outcome", "positions"}; written whole (temp file, fsync, rename)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, dict[str, float]]:
        """What is stored; an unreadable or malformed file reads as empty (it is a cache:
        the models are scored again and the file rewritten)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {sha: entry for sha, entry in data.items() if _valid(entry)}

    def add(self, sha256: str, result: dict[str, float]) -> None:
        data = self.load()
        data[sha256] = result
        atomic_write_json(self.path, dict(list(data.items())[-MODELS_KEPT:]))


def _valid(entry: object) -> bool:
    return isinstance(entry, dict) and all(
        isinstance(entry.get(k), (int, float)) and math.isfinite(entry[k]) for k in ("exact", "outcome"))
