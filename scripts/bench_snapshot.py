"""The snapshot part of scripts/bench_ops.py (`--snapshot`): kept apart so each file stays small.

Size: data dirs of N synthetic games (42 plies each, a 7-wide visit distribution a ply, as
self-play stores them) and M models of the default architecture (48x4); `snapshot save` and
`restore` timed, the archive's size against the data dir's.

Pause: a real lone node (`python -m app.p2p_orchestrator`, self-play on its default one
collect worker, 16 simulations) whose games.db was seeded with N games so each snapshot copies
a real amount; self-play positions/s measured from its replay DB over windows before, while
snapshots are taken back to back, and after, alternated.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from app.games.search.model import Architecture, ModelMeta, new_model, save_model  # noqa: E402
from app.cli.snapshot import restore, save  # noqa: E402
from app.config.paths import NodePaths  # noqa: E402
from app.coordination.sync import install_model  # noqa: E402
from app.db.registry import ModelRegistry  # noqa: E402
from app.db.replay_db import GameRecord, MoveRecord, ReplayDB  # noqa: E402
from app.games import get_game  # noqa: E402


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def seed_games(data_dir: Path, games: int, node_id: str = "seed") -> None:
    rng = random.Random(0)
    with ReplayDB(data_dir / "games.db") as db:
        for start in range(0, games, 1000):
            db.add_games(GameRecord(uid=f"{node_id}-{i}", game="connect4", winner=rng.choice([0, 1, None]), node_id=node_id,
                                    moves=[MoveRecord(rng.randrange(7), [1 / 7] * 7, 0.0) for _ in range(42)])
                         for i in range(start, min(games, start + 1000)))


def seed_models(data_dir: Path, models: int, work: Path) -> None:
    game = get_game("connect4")
    arch = Architecture(48, 4, game.plane_shape, game.num_actions)
    with ModelRegistry(data_dir / "registry.db") as registry:
        parent = None
        for g in range(1, models + 1):
            meta = save_model(new_model(arch, seed=g), ModelMeta(arch, game.name, g, parent), work / f"g{g}.safetensors")
            installed = install_model(work / f"g{g}.safetensors", data_dir / "models", meta.sha256)
            registry.register(meta.sha256, installed, g, parent)
            registry.promote(meta.sha256, "bench")
            parent = meta.sha256


def bench_sizes(sizes: list[tuple[int, int]]) -> list[dict]:
    out = []
    for games, models in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            data = tmp_path / "data"
            data.mkdir()
            seed_games(data, games)
            seed_models(data, models, tmp_path)
            archive = tmp_path / "n.snap"
            t0 = time.perf_counter()
            save(NodePaths(data), archive)
            saved_s = time.perf_counter() - t0
            t0 = time.perf_counter()
            restore(archive, tmp_path / "restored")
            restored_s = time.perf_counter() - t0
            out.append({"games": games, "models": models, "data_dir_mb": round(dir_bytes(data) / 1e6, 1),
                        "archive_mb": round(archive.stat().st_size / 1e6, 1), "save_s": round(saved_s, 2),
                        "restore_s": round(restored_s, 2)})
    return out


def _positions(db: Path) -> int:
    try:
        with sqlite3.connect(db, timeout=10) as conn:
            return conn.execute("SELECT COUNT(*) FROM moves").fetchone()[0]
    except sqlite3.Error:
        return 0


def bench_pause(seed_games_n: int, window_s: float, rounds: int) -> dict:
    """Self-play positions/s of a live node before / during back-to-back snapshots, alternated."""
    import yaml

    from tests.mesh_helpers import free_ports

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "data"
        data.mkdir()
        seed_games(data, seed_games_n)
        health, mesh = free_ports(2)
        (root / "config.yaml").write_text(yaml.safe_dump({
            "node": {"node_id": "bench", "data_dir": str(data), "health_port": health, "mesh_port": mesh},
            "selfplay": {"collect_workers": 1}}))
        (root / "daemons.yaml").write_text(yaml.safe_dump({"daemons": {
            "selfplay": {"critical": True, "settings": {"batch_games": 16, "simulations": 16}}}}))
        log = open(root / "node.log", "wb")
        proc = subprocess.Popen([sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
                                 "--daemons", str(root / "daemons.yaml")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        db = data / "games.db"
        try:
            start = _positions(db)
            deadline = time.monotonic() + 180
            while _positions(db) == start and time.monotonic() < deadline:  # warmed up: playing
                time.sleep(1.0)
            windows: dict[str, list[float]] = {"before": [], "during": []}
            snapshots: list[float] = []
            for _ in range(rounds):
                for phase in ("before", "during"):
                    p0, t0 = _positions(db), time.monotonic()
                    while time.monotonic() - t0 < window_s:
                        if phase == "during":
                            s0 = time.perf_counter()
                            save(NodePaths(data), root / "s.snap")
                            snapshots.append(time.perf_counter() - s0)
                        else:
                            time.sleep(0.5)
                    windows[phase].append((_positions(db) - p0) / (time.monotonic() - t0))
        finally:
            proc.terminate()
            try:
                proc.wait(40)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()
        before, during = sum(windows["before"]) / rounds, sum(windows["during"]) / rounds
        return {"seed_games": seed_games_n, "data_dir_mb": round(dir_bytes(data) / 1e6, 1), "window_s": window_s,
                "rounds": rounds, "positions_per_s_before": [round(x, 1) for x in windows["before"]],
                "positions_per_s_during": [round(x, 1) for x in windows["during"]],
                "during_over_before": round(during / before, 3) if before else None,
                "snapshots_taken": len(snapshots), "snapshot_s_median": round(sorted(snapshots)[len(snapshots) // 2], 2)
                if snapshots else None}


def cleanup(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
