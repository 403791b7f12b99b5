"""Where a node keeps its files, all under one data directory.

Kept beside the config so every layer and every CLI agrees on one layout: the orchestrator's
daemons and an operator's `scripts/auto_promote.py rollback` must open the same registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# How a node hands its database URL to its training processes (set in its environment, which
# they inherit: a URL may carry a password, so never on a command line); app/lm/train/mesh_rollouts.py
NODE_DB_URL_ENV = "MESH_NODE_DB_URL"


@dataclass(frozen=True)
class NodePaths:
    """Where a node keeps its files, all under one data directory."""

    data_dir: Path
    db_url: str | None = None  # the node's database (registry, games, work queue) instead of files

    @property
    def games_db(self) -> Path | str:
        return self.db_url or self.data_dir / "games.db"

    @property
    def registry_db(self) -> Path | str:
        return self.db_url or self.data_dir / "registry.db"

    @property
    def work_queue_db(self) -> Path | str:
        return self.db_url or self.data_dir / "work_queue.db"

    @property
    def dead_letters_db(self) -> Path:
        return self.data_dir / "dead_letters.db"

    @property
    def events_file(self) -> Path:
        return self.data_dir / "events.jsonl"

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
    def rollouts_db(self) -> Path | str:
        """The LM workload's rollout store (app/db/rollout_store.py)."""
        return self.db_url or self.data_dir / "rollouts.db"

    @property
    def lm_models_dir(self) -> Path:
        """The LM workload's models: Hugging Face directories `<sha256>/` (app/lm/model_dir.py)."""
        return self.data_dir / "lm_models"

    @property
    def datasets_dir(self) -> Path:
        return self.data_dir / "datasets"

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

