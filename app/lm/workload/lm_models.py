"""The LM workload's model store (steps.ModelStore): promoted models are Hugging Face
directories `<lm_models>/<manifest sha256>/`, fetched by manifest from peers, and a switch
weight-syncs every configured HTTP engine to the new directory.

The weight version of a model is its generation (0: the seeded random init). An engine's
version in /status is what the last sync made it; a failed sync is logged and shown there with
its error, and retried at the next promotion.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.config.lm import LMConfig
from app.config.paths import NodePaths
from app.coordination.p2p.node import MeshNode
from app.coordination.sync.model_fetch import peers_with_model
from app.coordination.sync.wire import is_sha256
from app.db.registry import ModelRegistry
from app.lm.model_dir import (
    ModelDirError, install_model_dir, installed_model_dir, read_model_manifest, verify_model_dir,
)
from app.lm.rollout.engine_config import build_engine
from app.lm.rollout.weight_sync import WeightSyncError, sync_weights
from app.lm.workload.lm_model_fetch import fetch_lm_model
from app.log import get_logger
from app.shared.manifests import MANIFEST_NAME

log = get_logger(__name__)
EngineStatus = dict[str, str | int | None]  # kind, weight_version, sha256, error


class ModelDirs:
    def __init__(self, lm: LMConfig, paths: NodePaths) -> None:
        self.lm = lm
        self.root = paths.lm_models_dir
        self.engines: dict[str, EngineStatus] = {}  # engine name -> what it serves, for /status

    def install(self, path: str | Path, sha256: str) -> Path:
        sha, final = install_model_dir(path, self.root)
        if sha != sha256:
            raise ModelDirError(f"{path}: its manifest hashes to {sha[:12]}, not the expected {sha256[:12]}")
        return final

    def installed_path(self, sha256: str) -> Path:
        return installed_model_dir(self.root, sha256)

    def is_installed(self, sha256: str) -> bool:
        return verify_model_dir(self.installed_path(sha256), sha256) is None

    def installed(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if is_sha256(p.name) and (p / MANIFEST_NAME).is_file())

    def register_candidate(self, registry: ModelRegistry, path: str | Path, generation: int) -> str:
        """Lineage from the run's result.json beside the candidate (generation.py writes it)."""
        sha = verified_sha(path)
        result_file = Path(path).parent / "result.json"
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        return registry.register(sha, Path(path).resolve(), int(result.get("generation", generation)),
                                 result.get("parent_sha256"), result.get("dataset_sha256")).sha256

    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str:
        return registry.register(verified_sha(path), path.resolve(), generation, None, None).sha256

    async def fetch(self, node: MeshNode, sha256: str) -> Path:
        peers = peers_with_model(node.cluster_view(), sha256, node.addr_of)
        return await fetch_lm_model(node.client, sha256, peers, self.root)

    async def switched(self, sha256: str, path: Path, generation: int) -> None:
        """Every HTTP engine loads the new directory (the in-process one is rebuilt by self-play)."""
        http = [build_engine(e, weight_version=generation) for e in self.lm.engines if e.kind != "in_process"]
        for e in self.lm.engines:
            if e.kind == "in_process":
                self.engines[e.name] = {"kind": e.kind, "weight_version": generation, "sha256": sha256}
        if not http:
            return
        try:
            report = await sync_weights(http, path, generation, timeout_s=min(e.sync_timeout_s for e in self.lm.engines))
            for name in report.seconds:
                self.engines[name] = {"kind": "http", "weight_version": generation, "sha256": sha256}
        except WeightSyncError as exc:
            log.warning("weight_sync_failed", generation=generation, failures=exc.failures)
            for name in exc.synced:
                self.engines[name] = {"kind": "http", "weight_version": generation, "sha256": sha256}
            for name, why in exc.failures.items():
                self.engines[name] = {**self.engines.get(name, {}), "error": why[:200]}


def verified_sha(path: str | Path) -> str:
    problem = verify_model_dir(path)
    if problem is not None:
        raise ModelDirError(problem)
    return read_model_manifest(path)[1]
