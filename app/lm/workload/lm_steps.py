"""The language-model workload's steps (steps.WorkloadSteps), on the same daemons as Connect Four.

    self-play     scored rollout groups of the best weights -> the rollout store (rollouts.db)
    export        the newest groups -> a dataset dir with a manifest (app/lm/rollout/rollout_dataset.py)
    train         GRPO on those groups under torchrun (app.lm.train.generation), generation 1 an
                  SFT on the task's demonstrations when `lm.grpo.mode: sft+rl`
    evaluation    candidate and best greedy on the same held-out prompts, the paired gate
    model store   Hugging Face directories `<lm_models>/<manifest sha256>/`, fetched by manifest
    switch        every configured HTTP engine is weight-synced to the promoted directory

The weight version of a model is its generation (0: the seeded random init), so a rollout
group says which generation's weights produced it and export can bound staleness.

Self-play batches are named by (node, model, batch number) and the batch number is this
node's stored group count divided by the batch size: a batch cut short by a kill -9 is the
same batch after the restart, and only its missing groups are generated (app/lm/rollout/batches.py).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from app.coordination.pipeline import state as ps
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.steps import BatchSummary, Evaluation
from app.coordination.sync.dataset_fetch import fetch_manifest_dir
from app.coordination.sync.dataset_server import dataset_routes
from app.lm.workload.lm_model_fetch import fetch_lm_model, lm_model_routes
from app.coordination.sync.model_fetch import peers_with_model
from app.coordination.sync.replica_server import replica_routes
from app.lm.workload.rollout_replica import STORE_NAME as ROLLOUTS, RolloutReplicaStore
from app.coordination.sync.streaming import FetchError
from app.coordination.sync.wire import is_sha256
from app.atomic_files import atomic_write_json
from app.db.registry import ModelRegistry
from app.db.rollout_store import RolloutStore
from app.lm.rollout.engine import InProcessEngine
from app.lm.causal_lm import load_model
from app.lm.rollout.weight_sync import WeightSyncError, sync_weights
from app.log import get_logger
from app.lm.workload.heldout import evaluate_pair
from app.shared.manifests import MANIFEST_NAME
from app.lm.rollout.rollout_dataset import export_rollouts, read_rollout_manifest, verify_rollout_dataset
from app.lm.workload.gate import GateResult, paired_gate
from app.lm.model_dir import (
    ModelDirError, install_model_dir, installed_model_dir, read_model_manifest, verify_model_dir,
)
from app.lm.rollout.batches import batch_prompts, rollout_batch
from app.lm.rollout.engine_config import build_engine
from app.lm.setup import (
    build_task, build_tokenizer, greedy_settings, heldout_prompts, initial_model, rollout_settings,
    train_prompts,
)

if TYPE_CHECKING:
    from app.coordination.daemons.daemon_registry import DaemonContext

log = get_logger(__name__)
HELDOUT_FILE = "heldout.json"  # {sha256: held-out summary} of every model this node evaluated
INITIAL_MODEL_ID = "init"
LM_DATASETS_ROUTE = "/lm_datasets"
IDLE_S = 1.0
FRESH_WAIT_S = 300.0  # how long an export waits for self-play to bring groups of the current best


class LMSteps:
    name = "lm"
    train_module = "app.lm.train.generation"
    candidate_name = "candidate"
    result_name = "result.json"

    def __init__(self) -> None:
        torch.set_num_threads(1)  # the node's event loop shares the cores with training ranks
        self._lock = threading.Lock()
        self._selfplay: tuple[str, Any] | None = None  # (model id, engine) self-play generates with
        self._kit: tuple[Any, Any, list] | None = None  # see _task_kit
        self.engines: dict[str, dict[str, Any]] = {}  # engine name -> its weight version, for /status

    # -- building blocks ------------------------------------------------------------------
    @staticmethod
    def _lm(pipe: PipelineContext):
        return pipe.settings.lm

    def _task_kit(self, pipe: PipelineContext) -> tuple[Any, Any, list]:
        """Self-play's (tokenizer, task, training prompt pool): built once, since a node's config
        is fixed for its life (self-play asks for them every batch, about twice a second)."""
        with self._lock:
            if self._kit is None:
                lm = self._lm(pipe)
                task = build_task(lm.task)
                self._kit = (build_tokenizer(lm.tokenizer), task, train_prompts(task, lm.task))
            return self._kit

    def _model(self, pipe: PipelineContext, path: str | None, tokenizer):
        return load_model(path) if path else initial_model(self._lm(pipe).model, tokenizer)

    def _selfplay_engine(self, pipe: PipelineContext, tokenizer) -> tuple[str, Any]:
        """The first configured engine, holding the best weights (rebuilt when they change)."""
        state = pipe.state
        model_id = state.best_sha256 or INITIAL_MODEL_ID
        if self._selfplay is None or self._selfplay[0] != model_id:
            first = self._lm(pipe).engines[0]
            model = self._model(pipe, state.best_path, tokenizer) if first.kind == "in_process" else None
            engine = build_engine(first, model, tokenizer, weight_version=state.best_generation)
            self._selfplay = (model_id, engine)
        return self._selfplay

    # -- self-play --------------------------------------------------------------------------
    def selfplay_batch(self, pipe: PipelineContext, cfg: dict, should_stop: Callable[[], bool]) -> BatchSummary:
        lm = self._lm(pipe)
        tokenizer, task, pool = self._task_kit(pipe)
        size = min(lm.rollout.batch_groups, len(pool))
        with self._lock:
            model_id, engine = self._selfplay_engine(pipe, tokenizer)
        with RolloutStore(pipe.paths.rollouts_db) as store:
            if self._enough_for_now(pipe, store):
                time.sleep(IDLE_S)  # two cores: leave them to training and evaluation
                return BatchSummary(0, 0, 0.0)
            batch = store.count(pipe.node_id) // size
            result = rollout_batch(
                engine, task, tokenizer, batch_prompts(pool, lm.task.seed, batch, size), rollout_settings(lm.rollout),
                store, node_id=pipe.node_id, model_id=model_id, seed=batch, model_sha256=pipe.state.best_sha256)
        samples = result.stored * lm.rollout.n
        return BatchSummary(result.stored, samples, samples / result.seconds if result.seconds > 0 else 0.0)

    def _enough_for_now(self, pipe: PipelineContext, store: RolloutStore) -> bool:
        """Outside collecting, once a whole export window of the best's groups is stored, more
        would only be thrown away (a promotion makes them stale): self-play idles until the
        generation is decided."""
        state = pipe.state
        if state.stage is ps.Stage.COLLECTING:
            return False
        window = self._lm(pipe).export.window_groups
        return len(store.uids_since_version(state.best_generation, window)) >= window

    def close_selfplay(self, pipe: PipelineContext) -> None:
        """Nothing to free: LM self-play runs in the node's own process."""

    def newest_item_id(self, pipe: PipelineContext) -> int:
        with RolloutStore(pipe.paths.rollouts_db) as store:
            return store.max_id()

    def created_counts(self, pipe: PipelineContext) -> dict[str, int]:
        with RolloutStore(pipe.paths.rollouts_db) as store:
            groups = store.count(pipe.node_id)
            return {"games_created": groups, "positions_created": groups * self._lm(pipe).rollout.n,
                    "games_max_id": store.max_id()}

    # -- export and training ----------------------------------------------------------------
    def export_threshold(self, pipe: PipelineContext, daemon_settings: dict) -> int:
        return self._lm(pipe).export.min_new_groups  # daemons.yaml's min_new_games counts games

    async def sync_before_export(self, pipe: PipelineContext, budget_s: float) -> dict[str, Any]:
        """Peers' rollouts arrive by the replication daemon (sync/rollout_replica.py), not here."""
        return {"new": 0, "errors": []}

    def export(self, pipe: PipelineContext, generation: int, out: Path) -> tuple[str, int]:
        """The newest window of groups no staler than `lm.rollout.max_staleness` generations.
        Right after a promotion most stored groups are the old model's: the export waits (a
        bounded time) for self-play to bring `min_new_groups` of the new one's."""
        lm = self._lm(pipe)
        if out.exists():  # an export interrupted before its stage was recorded: made again
            shutil.rmtree(out)
        min_version = max(0, pipe.state.best_generation - lm.rollout.max_staleness)
        need = min(lm.export.min_new_groups, lm.export.window_groups)
        deadline = time.monotonic() + FRESH_WAIT_S
        with RolloutStore(pipe.paths.rollouts_db) as store:
            while len(store.uids_since_version(min_version, need)) < need and time.monotonic() < deadline:
                time.sleep(0.5)
            result = export_rollouts(store, out, window_groups=lm.export.window_groups, min_version=min_version)
        return result.sha256, result.groups

    def final_loss(self, result: dict) -> float | None:
        final = result.get("final") or {}
        value = final.get("loss") if isinstance(final, dict) else None
        return float(value) if isinstance(value, (int, float)) else None

    def register_candidate(self, pipe: PipelineContext, path: str) -> str:
        sha = _verified_sha(path)
        result_file = Path(path).parent / self.result_name
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        with ModelRegistry(pipe.paths.registry_db) as registry:
            return registry.register(sha, Path(path).resolve(), int(result.get("generation", pipe.state.generation)),
                                     result.get("parent_sha256"), result.get("dataset_sha256")).sha256

    # -- evaluation and the gate ---------------------------------------------------------------
    async def evaluate(self, pipe: PipelineContext, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation:
        record = await asyncio.to_thread(self._evaluate, pipe, state)
        decision = self.decide(pipe, ps.PipelineState(generation=state.generation, evaluation=record), True)
        gate = record["gate"]
        n = max(1, gate["n"])
        results = {"heldout": {"wins": gate["wins"], "draws": gate["ties"], "losses": gate["losses"],
                               "score": (gate["wins"] + gate["ties"] / 2) / n}}
        return Evaluation(record, decision.promote, results)

    def _evaluate(self, pipe: PipelineContext, state: ps.PipelineState) -> dict[str, Any]:
        lm = self._lm(pipe)
        tokenizer = build_tokenizer(lm.tokenizer)  # its own: a fast tokenizer is not shared across threads
        task = build_task(lm.task)
        candidate = InProcessEngine(self._model(pipe, state.candidate_path, tokenizer), tokenizer,
                                    weight_version=state.generation, name="candidate")
        best = InProcessEngine(self._model(pipe, state.best_path, tokenizer), tokenizer,
                               weight_version=state.best_generation, name="best")
        ev = evaluate_pair(candidate, best, task, tokenizer, heldout_prompts(task, lm.task), greedy_settings(lm),
                           confidence=lm.eval.confidence, method=lm.eval.method,
                           min_improvement=lm.eval.min_improvement, bootstrap_samples=lm.eval.bootstrap_samples,
                           seed=lm.eval.seed)
        record = {"kind": "lm_heldout", **ev.to_json(lm.eval.confidence),
                  "rewards": {"candidate": ev.candidate.rewards, "best": ev.best.rewards}}
        self._remember_heldout(pipe, state, record)
        return record

    def decide(self, pipe: PipelineContext, state: ps.PipelineState, has_best: bool) -> GateResult:
        """The paired gate, recomputed from the stored per-prompt rewards: a pure function of the
        evaluation and the config, so a restart decides exactly as the first run would have."""
        cfg = self._lm(pipe).eval
        rewards = state.evaluation["rewards"]
        return paired_gate(rewards["candidate"], rewards["best"], confidence=cfg.confidence, method=cfg.method,
                           min_improvement=cfg.min_improvement, bootstrap_samples=cfg.bootstrap_samples, seed=cfg.seed)

    def heldout(self, evaluation: dict) -> dict[str, float] | None:
        c = evaluation.get("candidate")
        if not isinstance(c, dict):
            return None
        return {"reward": c["reward"], "low": c["interval"][0], "high": c["interval"][1],
                "exact_match": c["exact_match"], "best_reward": evaluation["best"]["reward"]}

    def _remember_heldout(self, pipe: PipelineContext, state: ps.PipelineState, record: dict) -> None:
        path = pipe.paths.data_dir / HELDOUT_FILE
        known = json.loads(path.read_text()) if path.exists() else {}
        known[state.candidate_sha256 or "?"] = {"generation": state.generation, **record["candidate"]}
        known[state.best_sha256 or INITIAL_MODEL_ID] = {"generation": state.best_generation, **record["best"]}
        atomic_write_json(path, known, indent=1)

    def progress_extra(self, pipe: PipelineContext, report: dict) -> dict[str, Any]:
        """/progress of a lone node: held-out reward by generation, with its interval."""
        path = pipe.paths.data_dir / HELDOUT_FILE
        known = json.loads(path.read_text()) if path.exists() else {}
        rows = sorted(({"sha256": sha, **v} for sha, v in known.items()), key=lambda r: r["generation"])
        return {"heldout": rows}

    # -- the model store and the switch ----------------------------------------------------
    def install(self, pipe: PipelineContext, path: str | Path, sha256: str) -> Path:
        sha, final = install_model_dir(path, pipe.paths.lm_models_dir)
        if sha != sha256:
            raise ModelDirError(f"{path}: its manifest hashes to {sha[:12]}, not the expected {sha256[:12]}")
        return final

    def installed_path(self, pipe: PipelineContext, sha256: str) -> Path:
        return installed_model_dir(pipe.paths.lm_models_dir, sha256)

    def is_installed(self, pipe: PipelineContext, sha256: str) -> bool:
        return verify_model_dir(self.installed_path(pipe, sha256), sha256) is None

    def installed_models(self, pipe: PipelineContext) -> list[str]:
        root = pipe.paths.lm_models_dir
        if not root.is_dir():
            return []
        return sorted(p.name for p in root.iterdir() if is_sha256(p.name) and (p / MANIFEST_NAME).is_file())

    async def fetch(self, pipe: PipelineContext, sha256: str) -> Path:
        node = pipe.cluster.node
        peers = peers_with_model(node.cluster_view(), sha256, node.addr_of)
        return await fetch_lm_model(node.client, sha256, peers, pipe.paths.lm_models_dir)

    async def fetch_dataset(self, pipe: PipelineContext, sha256: str, peer_addrs: list[str]) -> Path:
        """A joiner of a spanned run: the claimant's rollout dataset, verified file by file."""
        path, failures = await fetch_manifest_dir(
            pipe.cluster.node.client, sha256, peer_addrs, pipe.paths.datasets_dir, what="lm dataset",
            route=LM_DATASETS_ROUTE, verify=lambda p, sha: verify_rollout_dataset(p, sha))
        if path is None:
            raise FetchError("lm dataset", sha256, failures, "no peer to ask")
        return path

    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str:
        return registry.register(_verified_sha(path), path.resolve(), generation, None, None).sha256

    async def switched(self, pipe: PipelineContext, sha256: str, path: Path, generation: int) -> None:
        """Every HTTP engine loads the new directory (the in-process one is rebuilt by self-play);
        a failed sync is logged and shown in /status, and retried at the next promotion."""
        lm = self._lm(pipe)
        http = [build_engine(e, weight_version=generation) for e in lm.engines if e.kind != "in_process"]
        for e in lm.engines:
            if e.kind == "in_process":
                self.engines[e.name] = {"kind": e.kind, "weight_version": generation, "sha256": sha256}
        if not http:
            return
        try:
            report = await sync_weights(http, path, generation, timeout_s=min(e.sync_timeout_s for e in lm.engines))
            for name in report.seconds:
                self.engines[name] = {"kind": "http", "weight_version": generation, "sha256": sha256}
        except WeightSyncError as exc:
            log.warning("weight_sync_failed", generation=generation, failures=exc.failures)
            for name in exc.synced:
                self.engines[name] = {"kind": "http", "weight_version": generation, "sha256": sha256}
            for name, why in exc.failures.items():
                self.engines[name] = {**self.engines.get(name, {}), "error": why[:200]}

    def node_status(self, pipe: PipelineContext) -> dict[str, Any]:
        if not self.engines:  # before the first switch: what self-play starts from
            return {"lm_engines": {e.name: {"kind": e.kind, "weight_version": pipe.state.best_generation,
                                            "sha256": pipe.state.best_sha256} for e in self._lm(pipe).engines}}
        return {"lm_engines": dict(self.engines)}

    def routes(self, pipe: PipelineContext) -> list:
        """Model directories and rollout datasets by manifest sha256, and the rollout groups as a
        replicated store."""
        return [*lm_model_routes(pipe.paths.lm_models_dir),
                *replica_routes(ROLLOUTS, RolloutReplicaStore(pipe.paths.rollouts_db)),
                *dataset_routes(pipe.paths.datasets_dir, route=LM_DATASETS_ROUTE, what="lm dataset",
                                reader=read_rollout_manifest)]  # joiners of a spanned run

    def replica_store(self, pipe: PipelineContext) -> tuple[str, Any]:
        """Rollouts are replicated as Connect Four's games are: a claimant's export sees its
        peers' groups without a pull of its own."""
        return ROLLOUTS, RolloutReplicaStore(pipe.paths.rollouts_db)


def _verified_sha(path: str | Path) -> str:
    problem = verify_model_dir(path)
    if problem is not None:
        raise ModelDirError(problem)
    return read_model_manifest(path)[1]

