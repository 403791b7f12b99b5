"""Shared fixtures: paths to the shared benchmark positions, and one torch thread per process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)

pytest_plugins = ["tests.db_backends"]  # db_target: storage tests on SQLite and a real PostgreSQL

REPO = Path(__file__).resolve().parent.parent
PONS_DIR = REPO.parent / "shared" / "benchmarks" / "connect4"


@pytest.fixture(scope="session")
def pons_dir() -> Path:
    if not PONS_DIR.is_dir():
        raise FileNotFoundError(f"{PONS_DIR}: Pascal Pons' benchmark positions are expected beside the repo")
    return PONS_DIR
