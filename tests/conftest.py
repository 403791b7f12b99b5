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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`make test` runs two xdist workers that take whole files in collection order: the files
    with end-to-end tests (marked slow) go first, so the last file a worker picks up is a short
    one and neither worker idles while the other finishes a long run alone. The order within a
    file is kept."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
