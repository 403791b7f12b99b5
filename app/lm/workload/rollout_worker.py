"""A node that does not hold the training claim as a rollout worker of the online trainer
(issue 53, item 1): it generates groups from the trainer's newest weights, stamped with the
policy version, and the trainer takes them within `lm.rollout.max_staleness` trainer steps.

Nothing new travels: the trainer's node gossips its run's newest policy in `lm_training`
(run_metrics.py reads the pointer policy_publish.py writes); the worker fetches that directory
by sha256 from it (`/lm_policies/<sha256>/`, the dataset routes that serve promoted models),
loads it into an in-process engine of its own (self-play's engine keeps the best model), plays
a self-play batch with it (batches.rollout_batch: uids by node, weights and batch; the groups
carry the policy's sha256 and version) into its rollout store, and replication brings the
groups to the trainer's node, whose trainer reads them (remote_groups.py). The version a group
carries is the worker's claim; the trainer trusts only the sha256 of the weights.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.view import ClusterView
from app.coordination.sync.wire import is_sha256
from app.lm.causal_lm import load_model
from app.lm.rollout.engine import Engine, InProcessEngine
from app.lm.workload.lm_mesh import LMMesh
from app.log import get_logger

log = get_logger(__name__)


def trainer_policy(view: ClusterView, own_id: str) -> tuple[str, dict[str, Any]] | None:
    """(node id, policy) of the newest policy an alive peer's trainer gossips, None when none
    does (pure; a malformed entry is skipped)."""
    best: tuple[str, dict[str, Any]] | None = None
    for state in view.alive():
        if state.node_id == own_id:
            continue
        training = state.inventory.get("lm_training")
        policy = training.get("policy") if isinstance(training, dict) else None
        if not isinstance(policy, dict) or not isinstance(policy.get("sha256"), str):
            continue
        if not is_sha256(policy["sha256"]):
            continue
        if not all(isinstance(policy.get(k), int) and policy[k] >= 0 for k in ("generation", "version")):
            continue
        if best is None or (policy["generation"], policy["version"]) > (best[1]["generation"], best[1]["version"]):
            best = (state.node_id, policy)
    return best


class PolicyEngine:
    """The engine holding the trainer's newest policy this node fetched: the node's first engine
    when that is a server (SGLang, vLLM: `server` syncs it to the policy's directory), else an
    in-process engine of the worker's own."""

    def __init__(self, mesh: LMMesh, tokenizer: Any,
                 server: Callable[[Path, int, str], Engine | None] | None = None) -> None:
        self.mesh, self.tokenizer, self.server = mesh, tokenizer, server
        self.engine: InProcessEngine | None = None
        self.sha256: str | None = None
        # the policy of the last batch played: one batch a version, since a batch holds more
        # groups (batch_groups x oversample) than the trainer takes a step (groups_per_step)
        self.played: str | None = None

    def engine_for(self, node: MeshNode, peer: str, policy: dict[str, Any]) -> Engine | None:
        """The engine with `policy` loaded (fetched from `peer` first); None when the fetch or a
        server's sync failed (logged: the worker idles for a batch and asks again)."""
        sha, version = policy["sha256"], policy["version"]
        if sha == self.sha256 and self.engine is not None:
            return self.engine
        addr = node.addr_of(peer)
        try:
            path = asyncio.run(self.mesh.fetch_policy(node, sha, [addr] if addr else []))
        except Exception as exc:  # noqa: BLE001 - a peer's bad or vanished copy must not stop self-play
            log.warning("lm_policy_fetch_failed", peer=peer, sha256=sha[:12], version=version, error=str(exc)[:300])
            return None
        if self.server is not None:  # the node's server, synced to the directory (None: out of service)
            engine = self.server(path, version, sha)
            if engine is not None:
                self._swept(path, sha)
            return engine
        try:
            model = load_model(path)
        except Exception as exc:  # noqa: BLE001 - a peer's bad or vanished copy must not stop self-play
            log.warning("lm_policy_fetch_failed", peer=peer, sha256=sha[:12], version=version, error=str(exc)[:300])
            return None
        if self.engine is None:
            self.engine = InProcessEngine(model, self.tokenizer, weight_version=version, name="policy")
        else:
            self.engine.load_weights(model.state_dict(), version)
        self._swept(path, sha)
        return self.engine

    def _swept(self, path: Path, sha: str) -> None:
        """`sha` is loaded now: the copy of the policy before it is of no further use here."""
        if self.sha256 is not None and self.sha256 != sha:
            shutil.rmtree(path.parent / self.sha256, ignore_errors=True)
        self.sha256 = sha
