"""Each promoted model's raw network scored on the solver-scored positions, off the node's hot
path, once, into the data dir; nothing at all where no positions file exists."""

from __future__ import annotations

import asyncio

import pytest

from app.games.search.model import Architecture, ModelMeta, load_model, new_model, save_model
from app.config import load_settings
from app.coordination.pipeline.strength_watch import watch_strength
from app.workloads import pipeline_context
from app.coordination.sync import install_model
from app.db.registry import ModelRegistry
from app.games import get_game
from app.games.train.solved_accuracy import ACCURACY_FILE, AccuracyCache, positions_file
from app.games.train.solved_eval import accuracy, load_positions, network_choices
from tests.conftest import PONS_DIR

pytestmark = pytest.mark.timeout(120)
GAME = get_game("connect4")


def _node(tmp_path, positions):
    settings = load_settings(None, node={"node_id": "solo", "data_dir": str(tmp_path / "data")},
                             gauntlet={"solved_positions": str(positions)})
    pipe = pipeline_context(settings)
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    shas = []
    with ModelRegistry(pipe.paths.registry_db) as registry:
        for g in (1, 2):
            path = tmp_path / f"gen{g}.safetensors"
            meta = save_model(new_model(arch, seed=g), ModelMeta(arch, GAME.name, g), path)
            install_model(path, pipe.paths.models_dir, meta.sha256)
            registry.register(meta.sha256, str(path), g)
            registry.promote(meta.sha256, "test")
            shas.append(meta.sha256)
    return pipe, shas


async def test_promoted_models_are_scored_once_into_the_data_dir(tmp_path) -> None:
    positions = tmp_path / "move_scores.txt"
    positions.write_text("\n".join((PONS_DIR / "move_scores.txt").read_text().splitlines()[:60]) + "\n")
    pipe, shas = _node(tmp_path, positions)
    cache = AccuracyCache(pipe.paths.data_dir / ACCURACY_FILE)
    task = asyncio.create_task(watch_strength(pipe, interval_s=0.2))
    try:
        deadline = asyncio.get_running_loop().time() + 60
        while set(cache.load()) != set(shas):
            assert not task.done(), task
            assert asyncio.get_running_loop().time() < deadline, cache.load()
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    loaded = load_positions(positions)
    for sha in shas:
        net, _ = load_model(pipe.steps.models.installed_path(sha))
        want = accuracy(loaded, network_choices(net, loaded))
        assert cache.load()[sha] == {"exact": want["exact"], "outcome": want["outcome"], "positions": 60}


async def test_without_a_positions_file_nothing_is_scored(tmp_path) -> None:
    pipe, _ = _node(tmp_path, tmp_path / "absent" / "move_scores.txt")
    await asyncio.wait_for(watch_strength(pipe, interval_s=0.1), 10)  # returns at once, silently
    assert not (pipe.paths.data_dir / ACCURACY_FILE).exists()


def test_the_default_positions_are_the_shared_benchmark_beside_the_repo() -> None:
    assert positions_file(None) == PONS_DIR / "move_scores.txt"
