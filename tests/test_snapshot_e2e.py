"""`python -m app.cli snapshot` as an operator runs it: a snapshot of a lone node while it plays
self-play, restored onto a fresh dir and started on other ports; the restored node's games,
registry and best model are the manifest's. An old data dir (absolute paths, from a machine
where it lived elsewhere) is migrated on start; a truncated or corrupt archive is refused with
its path named, and a restore never writes into a dir that holds anything."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.cli.snapshot import summarize
from app.coordination.sync import install_model
from app.db.registry import ModelRegistry
from app.games import get_game
from app.shared.manifests import verify_stored_model
from tests.ops_cluster import LIGHT_DAEMONS
from tests.orchestrator_helpers import (
    TINY_CONFIG, get_json, start_node, stop_nodes, tail, tiny_selfplay, wait_until, write_node_files,
)

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
DAEMONS = {**LIGHT_DAEMONS, "daemons": {**LIGHT_DAEMONS["daemons"], "selfplay": tiny_selfplay(8)}}
OLD_ROOT = Path("/old/machine/data")  # where the seeded data dir "lived" before it was moved


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)


def games(data_dir: Path) -> int:
    path = data_dir / "games.db"
    if not path.exists():
        return 0
    with sqlite3.connect(path, timeout=10) as db:
        try:
            return db.execute("SELECT COUNT(*) FROM games").fetchone()[0]
        except sqlite3.OperationalError:  # the node is creating the tables
            return 0


def seed_old_data_dir(data_dir: Path, work: Path) -> str:
    """A promoted generation 1 as a node written before paths were relative left it, with the
    absolute paths of the machine it came from."""
    game = get_game("connect4")
    arch = Architecture(8, 1, game.plane_shape, game.num_actions)
    meta = save_model(new_model(arch, seed=1), ModelMeta(arch, game.name, 1, None), work / "gen1.safetensors")
    install_model(work / "gen1.safetensors", data_dir / "models", meta.sha256)
    old_path = str(OLD_ROOT / "models" / f"{meta.sha256}.safetensors")
    with ModelRegistry(data_dir / "registry.db") as registry:
        registry.register(meta.sha256, work / "gen1.safetensors", 1)
        registry.promote(meta.sha256, "seeded")
    with sqlite3.connect(data_dir / "registry.db") as db:  # as the old code stored it
        db.execute("UPDATE models SET path = ?", (old_path,))
    (data_dir / "pipeline_state.json").write_text(json.dumps({
        "generation": 2, "stage": "collecting", "export_mark": 0, "best_sha256": meta.sha256, "best_path": old_path,
        "best_generation": 1, "dataset_dir": None, "dataset_sha256": None, "run_dir": None, "candidate_path": None,
        "candidate_sha256": None, "evaluation": {}, "promoted": 1, "rejected": 0}))
    return meta.sha256


@pytest.mark.timeout(300)
def test_snapshot_of_a_running_node_restores_onto_a_fresh_dir(tmp_path: Path) -> None:
    source = write_node_files(tmp_path / "a", "solo", TINY_CONFIG, DAEMONS)
    source.data_dir.mkdir(parents=True)
    sha = seed_old_data_dir(source.data_dir, tmp_path)
    archive = tmp_path / "backups" / "solo.snap"
    procs = [start_node(source)]
    try:
        wait_until(lambda: games(source.data_dir) >= 8 or procs[0].poll() is not None, 120, what="self-play games")
        assert procs[0].poll() is None, tail(source)
        # migrated on start: relative paths, the moved model found again under this dir
        state = source.state()
        assert state["best_path"] == f"models/{sha}.safetensors", state
        with sqlite3.connect(source.data_dir / "registry.db") as db:
            assert db.execute("SELECT path FROM models").fetchone()[0] == f"models/{sha}.safetensors"
        saved = cli("snapshot", "save", str(archive), "--config", str(source.config))  # while it plays
        assert saved.returncode == 0, saved.stderr
        assert "saved" in saved.stdout and archive.exists() and not list(archive.parent.glob(".*")), saved.stdout
        before = games(source.data_dir)
        wait_until(lambda: games(source.data_dir) > before, 60, what="self-play goes on after the snapshot")
    finally:
        stop_nodes(procs)
    status = cli("snapshot", "--json", "status", str(archive))
    assert status.returncode == 0, status.stderr
    manifest_summary = json.loads(status.stdout)["summary"]
    assert manifest_summary["games"]["count"] >= 8 and manifest_summary["best_sha256"] == sha

    target = tmp_path / "b"
    restored = cli("snapshot", "restore", str(archive), "--data-dir", str(target / "data"))
    assert restored.returncode == 0, restored.stderr
    assert summarize(target / "data") == manifest_summary
    again = cli("snapshot", "restore", str(archive), "--data-dir", str(target / "data"))
    assert again.returncode == 1 and "not empty" in again.stderr and str(target / "data") in again.stderr

    copy = write_node_files(target, "solo", TINY_CONFIG, DAEMONS)  # same id, other ports
    assert copy.mesh_port != source.mesh_port
    procs = [start_node(copy)]
    try:
        status_of = lambda: get_json(copy.mesh_port, "/status")  # noqa: E731
        wait_until(lambda: (status_of() or {}).get("inventory", {}).get("best_sha256")
                   or procs[0].poll() is not None, 90, what="the restored node's /status")
        assert procs[0].poll() is None, tail(copy)
        inventory = status_of()["inventory"]
        assert inventory["best_sha256"] == sha and inventory["games_max_id"] >= manifest_summary["games"]["newest_id"]
        with ModelRegistry(copy.data_dir / "registry.db") as registry:
            best = registry.current_best()
            assert best is not None and best.sha256 == sha
            assert [(m.sha256, m.generation, m.status.value) for m in registry.models()] == \
                [(m["sha256"], m["generation"], m["status"]) for m in manifest_summary["models"]]
            assert verify_stored_model(best.path, sha) is None and best.path.startswith(str(copy.data_dir))
    finally:
        stop_nodes(procs)


@pytest.mark.timeout(300)
def test_a_truncated_or_corrupt_archive_is_refused_naming_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    seed_old_data_dir(data_dir, tmp_path)
    archive = tmp_path / "full.snap"
    saved = cli("snapshot", "save", str(archive), "--data-dir", str(data_dir))
    assert saved.returncode == 0, saved.stderr
    body = archive.read_bytes()
    truncated = tmp_path / "truncated.snap"
    truncated.write_bytes(body[: len(body) * 2 // 3])
    refused = cli("snapshot", "restore", str(truncated), "--data-dir", str(tmp_path / "new"))
    assert refused.returncode == 1 and str(truncated) in refused.stderr, refused.stderr
    assert "truncated" in refused.stderr or "partial" in refused.stderr, refused.stderr
    assert not (tmp_path / "new").exists() and not list(tmp_path.glob(".new.restore-*"))
    corrupt = tmp_path / "corrupt.snap"
    with tarfile.open(archive) as tar:
        member = next(m for m in tar.getmembers() if m.name.startswith("models/"))
    flipped = bytearray(body)
    flipped[member.offset_data + member.size // 2] ^= 0xFF  # inside the model's bytes
    corrupt.write_bytes(bytes(flipped))
    refused = cli("snapshot", "restore", str(corrupt), "--data-dir", str(tmp_path / "new"))
    assert refused.returncode == 1 and str(corrupt) in refused.stderr and "sha256" in refused.stderr, refused.stderr
    assert not (tmp_path / "new").exists()
