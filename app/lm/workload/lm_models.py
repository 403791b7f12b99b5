"""The LM workload's model store (steps.ModelStore): promoted models are Hugging Face
directories `<lm_models>/<manifest sha256>/`, fetched by manifest from peers, and a switch
weight-syncs every configured engine to the new directory (lm_engines.NodeEngines).

The weight version of a model is its generation (0: the seeded random init). An engine's
version in /status is what it reported after its last load; a failed sync is logged and
shown there with its error, and self-play tries again before it generates.
"""

from __future__ import annotations

import json
import shutil
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
from app.lm.workload.lm_engines import NodeEngines
from app.lm.workload.lm_model_fetch import fetch_lm_model
from app.shared.manifests import MANIFEST_NAME


class ModelDirs:
    def __init__(self, lm: LMConfig, paths: NodePaths, engines: NodeEngines) -> None:
        self.lm = lm
        self.root = paths.lm_models_dir
        self.engines = engines

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

    def remove(self, sha256: str) -> int:
        """Delete the directory of model `sha256`; the bytes freed (0: not there)."""
        path = self.installed_path(sha256)
        if not path.is_dir():
            return 0
        freed = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        shutil.rmtree(path)
        return freed

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
        """Every engine loads the new directory, as version `generation`."""
        await self.engines.switched(path, generation, sha256)


def verified_sha(path: str | Path) -> str:
    problem = verify_model_dir(path)
    if problem is not None:
        raise ModelDirError(problem)
    return read_model_manifest(path)[1]
