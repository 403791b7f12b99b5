"""The language-model workload's steps (app/coordination/pipeline/steps.py), on the same
daemons as Connect Four.

    self-play     scored rollout groups of the best weights -> the rollout store (rollouts.db)
    export        the newest groups -> a dataset dir with a manifest (app/lm/rollout/rollout_dataset.py)
    train         GRPO on those groups under torchrun (app.lm.train.generation), generation 1 an
                  SFT on the task's demonstrations when `lm.grpo.mode: sft+rl`
    evaluation    candidate and best greedy on the same held-out prompts, the paired gate
    model store   Hugging Face directories `<lm_models>/<manifest sha256>/`, fetched by manifest,
                  and on a switch every configured HTTP engine weight-synced (lm_models.py)

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

import torch
from aiohttp import web
from transformers import PreTrainedTokenizerBase

from app.atomic_files import atomic_write_json
from app.config import Settings
from app.config.lm import LMConfig
from app.config.paths import NodePaths
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.runner_settings import ExportSettings, SelfplaySettings
from app.coordination.pipeline.steps import BatchSummary, Evaluation, Json, Pipe, TrainingJob
from app.db.rollout_store import RolloutStore
from app.lm.rollout.batches import batch_prompts, rollout_batch
from app.lm.rollout.engine import Engine
from app.lm.rollout.engine_config import build_engine
from app.lm.rollout.rollout_dataset import export_rollouts
from app.lm.setup import check_inputs, model_at, rollout_settings, train_prompts
from app.lm.tasks import Prompt, Task
from app.lm.workload.gate import GateResult, paired_gate
from app.lm.workload.heldout import ModelRef, heldout_record
from app.lm.workload.lm_mesh import LMMesh
from app.lm.workload.lm_models import ModelDirs
from app.lm.workload.rollout_replica import RolloutItems
from app.log import get_logger

log = get_logger(__name__)
HELDOUT_FILE = "heldout.json"  # {sha256: held-out summary} of every model this node evaluated
INITIAL_MODEL_ID = "init"
IDLE_S = 1.0
FRESH_WAIT_S = 300.0  # how long an export waits for self-play to bring groups of the current best


class LMSteps:
    name = "lm"
    training = TrainingJob("app.lm.train.generation", loss_key="final_loss")

    def __init__(self, settings: Settings) -> None:
        torch.set_num_threads(1)  # the node's event loop shares the cores with training ranks
        self.lm: LMConfig = settings.lm
        self.paths = NodePaths(Path(settings.node.data_dir), settings.node.db_url)
        self.items = RolloutItems(self.paths.rollouts_db, self.lm.rollout.n)
        self.models = ModelDirs(self.lm, self.paths)
        self.mesh = LMMesh(self.paths)  # what it serves to peers and fetches from them
        self._lock = threading.Lock()
        self._selfplay: tuple[str, Engine] | None = None  # (model id, engine) self-play generates with
        # Self-play's (tokenizer, task, training prompt pool), built once at start: a node's config
        # is fixed for its life, and what it names (model dir, prompt file, reward) is checked
        # here, so a bad path or import stops the node with one line (a ValueError) before any daemon.
        tokenizer, task = check_inputs(self.lm)
        self._kit: tuple[PreTrainedTokenizerBase, Task, list[Prompt]] = (tokenizer, task,
                                                                         train_prompts(task, self.lm.task))

    # -- building blocks ------------------------------------------------------------------
    def _task_kit(self) -> tuple[PreTrainedTokenizerBase, Task, list[Prompt]]:
        return self._kit

    def _selfplay_engine(self, pipe: Pipe, tokenizer: PreTrainedTokenizerBase) -> tuple[str, Engine]:
        """The first configured engine, holding the best weights (rebuilt when they change)."""
        state = pipe.state
        model_id = state.best_sha256 or INITIAL_MODEL_ID
        if self._selfplay is None or self._selfplay[0] != model_id:
            first = self.lm.engines[0]
            model = model_at(self.lm.model, state.best_path, tokenizer) if first.kind == "in_process" else None
            engine = build_engine(first, model, tokenizer, weight_version=state.best_generation)
            self._selfplay = (model_id, engine)
        return self._selfplay

    # -- self-play --------------------------------------------------------------------------
    def export_threshold(self, export: ExportSettings) -> int:
        """`lm.export.min_new_groups` (daemons.yaml's `min_new_games` counts games: an lm node
        refuses it, app/workloads.py)."""
        return self.lm.export.min_new_groups

    def selfplay_batch(self, pipe: Pipe, settings: SelfplaySettings, should_stop: Callable[[], bool]) -> BatchSummary:
        lm = self.lm
        tokenizer, task, pool = self._task_kit()
        size = min(lm.rollout.batch_groups, len(pool))
        with self._lock:
            model_id, engine = self._selfplay_engine(pipe, tokenizer)
        with RolloutStore(self.paths.rollouts_db) as store:
            if self._enough_for_now(pipe, store):
                time.sleep(IDLE_S)  # two cores: leave them to training and evaluation
                return BatchSummary(0, 0, 0.0)
            batch = store.count(pipe.node_id) // size
            result = rollout_batch(
                engine, task, tokenizer, batch_prompts(pool, lm.task.seed, batch, size), rollout_settings(lm.rollout),
                store, node_id=pipe.node_id, model_id=model_id, seed=batch, model_sha256=pipe.state.best_sha256)
        samples = result.stored * lm.rollout.n
        return BatchSummary(result.stored, samples, samples / result.seconds if result.seconds > 0 else 0.0)

    def _enough_for_now(self, pipe: Pipe, store: RolloutStore) -> bool:
        """Outside collecting, once a whole export window of the best's groups is stored, more
        would only be thrown away (a promotion makes them stale): self-play idles until the
        generation is decided."""
        state = pipe.state
        if state.stage is ps.Stage.COLLECTING:
            return False
        window = self.lm.export.window_groups
        return len(store.uids_since_version(state.best_generation, window)) >= window

    def close_selfplay(self) -> None:
        """Nothing to free: LM self-play runs in the node's own process."""

    # -- export and training ----------------------------------------------------------------
    def export(self, pipe: Pipe, generation: int, out: Path) -> tuple[str, int]:
        """The newest window of groups no staler than `lm.rollout.max_staleness` generations.
        Right after a promotion most stored groups are the old model's: the export waits (a
        bounded time) for self-play to bring `min_new_groups` of the new one's. Peers' groups
        arrive by the replication daemon (rollout_replica.py), so there is no pull before it."""
        lm = self.lm
        if out.exists():  # an export interrupted before its stage was recorded: made again
            shutil.rmtree(out)
        min_version = max(0, pipe.state.best_generation - lm.rollout.max_staleness)
        need = min(lm.export.min_new_groups, lm.export.window_groups)
        deadline = time.monotonic() + FRESH_WAIT_S
        with RolloutStore(self.paths.rollouts_db) as store:
            while len(store.uids_since_version(min_version, need)) < need and time.monotonic() < deadline:
                time.sleep(0.5)
            result = export_rollouts(store, out, window_groups=lm.export.window_groups, min_version=min_version)
        return result.sha256, result.groups

    async def fetch_dataset(self, node: MeshNode, sha256: str, peer_addrs: list[str]) -> Path:
        return await self.mesh.fetch_dataset(node, sha256, peer_addrs)

    # -- evaluation and the gate ---------------------------------------------------------------
    async def evaluate(self, pipe: Pipe, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation:
        record = await asyncio.to_thread(self._evaluate, state)
        decision = self.decide(pipe, ps.PipelineState(generation=state.generation, evaluation=record), True)
        gate = record["gate"]
        n = max(1, gate["n"])
        results = {"heldout": {"wins": gate["wins"], "draws": gate["ties"], "losses": gate["losses"],
                               "score": (gate["wins"] + gate["ties"] / 2) / n}}
        return Evaluation(record, decision.promote, results)

    def _evaluate(self, state: ps.PipelineState) -> Json:
        record = heldout_record(self.lm, ModelRef(state.candidate_path, state.generation),
                                ModelRef(state.best_path, state.best_generation))
        self._remember_heldout(state, record)
        return record

    def decide(self, pipe: Pipe, state: ps.PipelineState, has_best: bool) -> GateResult:
        """The paired gate, recomputed from the stored per-prompt rewards: a pure function of the
        evaluation and the config, so a restart decides exactly as the first run would have."""
        cfg = self.lm.eval
        rewards = state.evaluation["rewards"]
        return paired_gate(rewards["candidate"], rewards["best"], confidence=cfg.confidence, method=cfg.method,
                           min_improvement=cfg.min_improvement, bootstrap_samples=cfg.bootstrap_samples, seed=cfg.seed)

    def _remember_heldout(self, state: ps.PipelineState, record: Json) -> None:
        path = self.paths.data_dir / HELDOUT_FILE
        known = json.loads(path.read_text()) if path.exists() else {}
        known[state.candidate_sha256 or "?"] = {"generation": state.generation, **record["candidate"]}
        known[state.best_sha256 or INITIAL_MODEL_ID] = {"generation": state.best_generation, **record["best"]}
        atomic_write_json(path, known, indent=1)

    # -- the mesh and operators (steps.ReportsStatus) ---------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return self.mesh.routes()

    def close(self) -> None:
        self.mesh.close()

    def node_status(self, pipe: Pipe) -> Json:
        """The inference engines and the weights they serve."""
        if not self.models.engines:  # before the first switch: what self-play starts from
            return {"lm_engines": {e.name: {"kind": e.kind, "weight_version": pipe.state.best_generation,
                                            "sha256": pipe.state.best_sha256} for e in self.lm.engines}}
        return {"lm_engines": dict(self.models.engines)}

    def progress_extra(self, pipe: Pipe) -> Json:
        """/progress of a lone node: held-out reward by generation, with its interval."""
        path = self.paths.data_dir / HELDOUT_FILE
        known = json.loads(path.read_text()) if path.exists() else {}
        rows = sorted(({"sha256": sha, **v} for sha, v in known.items()), key=lambda r: r["generation"])
        return {"heldout": rows}

    def heldout(self, evaluation: Json) -> dict[str, float] | None:
        c = evaluation.get("candidate")
        best = evaluation.get("best")
        if not isinstance(c, dict) or not isinstance(best, dict):
            return None
        return {"reward": c["reward"], "low": c["interval"][0], "high": c["interval"][1],
                "exact_match": c["exact_match"], "best_reward": best["reward"]}
