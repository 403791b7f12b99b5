"""Where a node keeps its files, all under one data directory.

Kept beside the config so every layer and every CLI agrees on one layout: the orchestrator's
daemons and an operator's `scripts/auto_promote.py rollback` must open the same registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps its files, all under one data directory."""

    data_dir: Path

    @property
    def games_db(self) -> Path:
        return self.data_dir / "games.db"

    @property
    def registry_db(self) -> Path:
        return self.data_dir / "registry.db"

    @property
    def dead_letters_db(self) -> Path:
        return self.data_dir / "dead_letters.db"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "pipeline_state.json"

    @property
    def history_file(self) -> Path:
        return self.data_dir / "pipeline_history.jsonl"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def model_path(self, sha256: str) -> Path:
        return self.models_dir / f"{sha256}.safetensors"
