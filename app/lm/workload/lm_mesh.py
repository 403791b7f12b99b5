"""What the LM workload serves on the mesh and fetches from it: its model directories and
rollout datasets by manifest sha256 (the dataset machinery of app/coordination/sync), and the
rollout groups as a replicated store (/replica/rollouts/), and the online trainer's newest
policy for rollout workers on other nodes (/lm_policies/<sha256>/, rollout_worker.py)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from app.config.paths import NodePaths
from app.coordination.p2p.node import MeshNode
from app.coordination.sync.dataset_fetch import fetch_manifest_dir
from app.coordination.sync.dataset_server import dataset_routes
from app.coordination.sync.replica_server import replica_routes
from app.coordination.sync.streaming import FetchError
from app.lm.model_dir import read_model_manifest, verify_model_dir
from app.lm.rollout.rollout_dataset import read_rollout_manifest, verify_rollout_dataset
from app.lm.train.policy_publish import POLICIES_DIR
from app.lm.workload.lm_model_fetch import lm_model_routes
from app.lm.workload.rollout_replica import STORE_NAME, RolloutReplicaStore

LM_DATASETS_ROUTE = "/lm_datasets"
LM_POLICIES_ROUTE = "/lm_policies"  # the online trainer's newest weights, for rollout workers (policy_publish.py)


class LMMesh:
    def __init__(self, paths: NodePaths) -> None:
        self.paths = paths
        self._served: RolloutReplicaStore | None = None  # /replica/rollouts/ for peers, opened by routes()

    def routes(self) -> list[web.RouteDef]:
        """Model directories and rollout datasets by manifest sha256 (joiners of a spanned run
        fetch the latter), and the rollout groups as a replicated store."""
        self._served = self._served or RolloutReplicaStore(self.paths.rollouts_db)
        return [*lm_model_routes(self.paths.lm_models_dir), *replica_routes(STORE_NAME, self._served),
                *dataset_routes(self.paths.datasets_dir, route=LM_DATASETS_ROUTE, what="lm dataset",
                                reader=read_rollout_manifest),
                *dataset_routes(self.paths.data_dir / POLICIES_DIR, route=LM_POLICIES_ROUTE, what="lm policy",
                                reader=read_model_manifest)]

    def close(self) -> None:
        if self._served is not None:
            self._served.close()

    async def fetch_policy(self, node: MeshNode, sha256: str, peer_addrs: list[str]) -> Path:
        """A rollout worker: the trainer's published policy directory, verified file by file."""
        path, failures = await fetch_manifest_dir(
            node.client, sha256, peer_addrs, self.paths.data_dir / POLICIES_DIR, what="lm policy",
            route=LM_POLICIES_ROUTE, verify=verify_model_dir)
        if path is None:
            raise FetchError("lm policy", sha256, failures, "no peer to ask")
        return path

    async def fetch_dataset(self, node: MeshNode, sha256: str, peer_addrs: list[str]) -> Path:
        """A joiner of a spanned run: the claimant's rollout dataset, verified file by file."""
        path, failures = await fetch_manifest_dir(
            node.client, sha256, peer_addrs, self.paths.datasets_dir, what="lm dataset",
            route=LM_DATASETS_ROUTE, verify=lambda p, sha: verify_rollout_dataset(p, sha))
        if path is None:
            raise FetchError("lm dataset", sha256, failures, "no peer to ask")
        return path
