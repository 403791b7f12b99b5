"""A live 3-node cluster for the operator tests (dashboard, Prometheus, CLI rollback) that needs
no training run: the nodes start with promoted generations already decided, seeded on disk as
if they had trained them (generation log and model store on every node; the trainer's
registry ratings with intervals and its run results with losses on n0 only, so the others
learn those by gossip). Everything after the seed is the real mesh, quorum and daemons.

A training run on this 2-core machine takes minutes per generation; the end-to-end training
tests (test_configs_cluster_e2e.py) cover that, these cover what operators see and do.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.coordination.pipeline.generation_log import GenerationRecord
from app.coordination.sync import install_model
from app.db.registry import ModelRegistry
from app.games import get_game
from tests.orchestrator_helpers import SMALL_CONFIG, NodeFiles, start_node, write_node_files

IDS = ["n0", "n1", "n2"]
LIGHT_DAEMONS = {"restart": {"base_s": 0.5, "cap_s": 5},
                 "daemons": {"dlq_retry": {}, "distribution": {"critical": True, "settings": {"poll_s": 0.3}}}}


@dataclass(frozen=True)
class Seeded:
    shas: list[str]  # by generation, 1-based: shas[0] is generation 1
    elos: list[float]


def seed_generations(nodes: list[NodeFiles], work: Path, generations: int = 2) -> Seeded:
    game = get_game("connect4")
    arch = Architecture(16, 1, game.plane_shape, game.num_actions)
    shas, elos, records = [], [], []
    for g in range(1, generations + 1):
        path = work / f"gen{g}.safetensors"
        meta = save_model(new_model(arch, seed=g), ModelMeta(arch, "connect4", g, shas[-1] if shas else None), path)
        shas.append(meta.sha256)
        elos.append(150.0 + 120.0 * g)
        records.append(GenerationRecord(g, meta.sha256, True, 100 * g, "n0", "seeded: gates passed",
                                        elos[-1]).__dict__)
    for files in nodes:
        files.data_dir.mkdir(parents=True, exist_ok=True)
        (files.data_dir / "generations.json").write_text(json.dumps(records))
        for g, sha in enumerate(shas, 1):
            install_model(work / f"gen{g}.safetensors", files.data_dir / "models", sha)
    trainer = nodes[0].data_dir
    with ModelRegistry(trainer / "registry.db") as registry:
        for g, sha in enumerate(shas, 1):
            registry.register(sha, str(work / f"gen{g}.safetensors"), g, shas[g - 2] if g > 1 else None)
            registry.promote(sha, "seeded: gates passed")
        registry.store_ratings([(f"model:{sha}", elo, elo - 60.0, elo + 60.0, 40) for sha, elo in zip(shas, elos)],
                               {f"model:{sha}": sha for sha in shas})
    for g, sha in enumerate(shas, 1):
        run = trainer / "runs" / f"gen_{g:04d}"
        run.mkdir(parents=True, exist_ok=True)
        (run / "result.json").write_text(json.dumps({"candidate_sha256": sha, "best_holdout_loss": 3.0 - 0.4 * g}))
    return Seeded(shas, elos)


def make_nodes(root: Path, daemons: dict | None = None) -> list[NodeFiles]:
    return [write_node_files(root / nid, nid, SMALL_CONFIG, daemons or LIGHT_DAEMONS) for nid in IDS]


def start(files: NodeFiles, i: int, nodes: list[NodeFiles]) -> subprocess.Popen:
    peers = ",".join(f"{IDS[j]}@127.0.0.1:{nodes[j].mesh_port}" for j in range(len(IDS)) if j != i)
    return start_node(files, "--voters", ",".join(IDS), "--peers", peers, "--priority", str(i), "--profile", "fast")
