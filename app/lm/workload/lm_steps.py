"""The language-model workload's steps (app/coordination/pipeline/steps.py), on the same
daemons as Connect Four.

    self-play     scored rollout groups of the best weights, through the rollout manager's
                  over-sampling and filters -> the rollout store (rollouts.db); dropped groups
                  are counted by reason (metrics, /status, the dataset's manifest); online,
                  while a peer trains, of the trainer's newest published policy instead (a
                  rollout worker: rollout_worker.py), for the trainer to take
    export        the newest groups -> a dataset dir with a manifest (app/lm/rollout/rollout_dataset.py)
    train         GRPO under torchrun (app.lm.train.generation), generation 1 an SFT alone on
                  the task's demonstrations when `lm.grpo.mode: sft+rl`; with
                  `lm.grpo.rollouts: online` (the default) on groups the trainer generates
                  from its own newest weights each step (self-play's groups then only pace
                  the generations: it idles outside collecting), with `stored` on those groups
    evaluation    candidate and best greedy on the same held-out prompts, the paired gate
    model store   Hugging Face directories `<lm_models>/<manifest sha256>/`, fetched by manifest,
                  and on a switch every configured HTTP engine weight-synced (lm_models.py)

The weight version of a model is its generation (0: the seeded random init), so a rollout
group says which generation's weights produced it and export can bound staleness.

Self-play batches are named by (node, model, batch number) and the batch number is this
node's settled group count (stored or dropped) divided by the batch's prompt count: a batch
cut short by a kill -9 is the same batch after the restart, and only its missing groups are
played (app/lm/rollout/batches.py). Rewards run in the node's reward pool (worker processes,
each call bounded): a reward that hangs or fails drops its group, and the node goes on.
Self-play generates only with an engine in service holding the best weights
(lm_engines.NodeEngines): after a failed sync it idles, storing nothing, until a sync succeeds.
"""

from __future__ import annotations

import asyncio
import json
import math
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
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
from app.coordination.pipeline.steps import BatchSummary, Evaluation, Json, Pipe, TrainingJob, Verdict
from app.db.rollout_store import RolloutStore
from app.lm.reward_pool import RewardPool
from app.lm.rollout.batches import batch_prompts, rollout_batch
from app.lm.rollout.engine import EngineOutOfService
from app.lm.rollout.rollout_dataset import export_rollouts
from app.lm.rollout.rollout_manager import ManagerSettings
from app.lm.setup import check_inputs, reward_pool, rollout_settings, train_prompts
from app.lm.tasks import Prompt, Task
from app.lm.workload.gate import GateResult, paired_gate
from app.lm.workload.heldout import ModelRef, heldout_record
from app.lm.workload.lm_engines import INIT_ID, NodeEngines
from app.lm.workload.lm_mesh import LMMesh
from app.lm.workload.lm_models import ModelDirs
from app.lm.workload.rollout_replica import RolloutItems
from app.lm.workload.dashboard_panel import heldout_rows, training_rows
from app.lm.workload.rollout_worker import PolicyEngine, trainer_policy
from app.lm.workload.run_metrics import run_progress
from app.lm.train.checkpoint_dirs import PHASE_DIRS
from app.log import get_logger

log = get_logger(__name__)
HELDOUT_FILE = "heldout.json"  # {sha256: held-out summary} of every model this node evaluated
INITIAL_MODEL_ID = INIT_ID
IDLE_S = 1.0
FRESH_WAIT_S = 300.0  # how long an export waits for self-play to bring groups of the current best


class LMSteps:
    name = "lm"
    training = TrainingJob("app.lm.train.generation", loss_key="final_loss", mesh_flag="--mesh-data-dir",
                           continue_flag="--continue-from", follow_flag="--follow", checkpoint_names=PHASE_DIRS)

    def __init__(self, settings: Settings) -> None:
        torch.set_num_threads(1)  # the node's event loop shares the cores with training ranks
        self.lm: LMConfig = settings.lm
        self.paths = NodePaths(Path(settings.node.data_dir), settings.node.db_url)
        self.items = RolloutItems(self.paths.rollouts_db, self.lm.rollout.n)
        self.engines = NodeEngines(self.lm, self.paths)
        self.models = ModelDirs(self.lm, self.paths, self.engines)
        self.mesh = LMMesh(self.paths)  # what it serves to peers and fetches from them
        self._lock = threading.Lock()
        # Self-play's (tokenizer, task, training prompt pool), built once at start: a node's config
        # is fixed for its life, and what it names (model dir, prompt file, reward) is checked
        # here, so a bad path or import stops the node with one line (a ValueError) before any daemon.
        tokenizer, task = check_inputs(self.lm)
        self._kit: tuple[PreTrainedTokenizerBase, Task, list[Prompt]] = (tokenizer, task,
                                                                         train_prompts(task, self.lm.task))
        self._rewards: RewardPool | None = None
        self._dropped: Counter[str] | None = None  # this node's dropped groups by reason (from the store)
        self._policy: PolicyEngine | None = None  # a rollout worker's engine of the trainer's policy
        self.policy_batches = 0  # batches this node played as a rollout worker (/status)
        r = self.lm.rollout
        # self-play stores every complete group, equal rewards included: the trainer applies
        # `lm.rollout.zero_variance` (StoredGroups, or the online loop's own filter). Dropped here,
        # a poor model's groups (nearly all equal) would starve the export for many minutes.
        self.filters = ManagerSettings(batch_groups=r.batch_groups, group_size=r.n, oversample=r.oversample,
                                       max_staleness=r.max_staleness, zero_variance="keep")

    # -- building blocks ------------------------------------------------------------------
    def _task_kit(self) -> tuple[PreTrainedTokenizerBase, Task, list[Prompt]]:
        return self._kit

    def _reward_pool(self) -> RewardPool:
        """The node's reward workers (self-play and evaluation), started at first use."""
        with self._lock:
            if self._rewards is None:
                self._rewards = reward_pool(self.lm, self._kit[1])
            return self._rewards

    # -- self-play --------------------------------------------------------------------------
    def export_threshold(self, export: ExportSettings) -> int:
        """`lm.export.min_new_groups` (daemons.yaml's `min_new_games` counts games: an lm node
        refuses it, app/workloads.py)."""
        return self.lm.export.min_new_groups

    def selfplay_batch(self, pipe: Pipe, settings: SelfplaySettings, should_stop: Callable[[], bool]) -> BatchSummary:
        lm = self.lm
        tokenizer, task, pool = self._task_kit()
        state = pipe.state
        worker = self._policy_to_play(pipe)
        if worker is not None:
            return self._policy_batch(pipe, *worker)
        engine = self.engines.rollout_engine(state.best_path, state.best_generation, state.best_sha256, tokenizer)
        if engine is None:  # out of service: nothing it would generate may be stored
            time.sleep(IDLE_S)
            return BatchSummary(0, 0, 0.0)
        size = min(math.ceil(lm.rollout.batch_groups * lm.rollout.oversample), len(pool))
        with RolloutStore(self.paths.rollouts_db) as store:
            self._count_dropped(store, pipe.node_id)
            if self._enough_for_now(pipe, store):
                time.sleep(IDLE_S)  # two cores: leave them to training and evaluation
                return BatchSummary(0, 0, 0.0)
            batch = store.count_settled(pipe.node_id) // size
            try:
                result = rollout_batch(
                    engine, task, tokenizer, batch_prompts(pool, lm.task.seed, batch, size),
                    rollout_settings(lm.rollout), store, node_id=pipe.node_id,
                    model_id=state.best_sha256 or INITIAL_MODEL_ID, seed=batch, model_sha256=state.best_sha256,
                    manager=self.filters, rewards=self._reward_pool(), current_version=state.best_generation)
            except EngineOutOfService as exc:
                log.warning("lm_selfplay_engine_out_of_service", engine=engine.name, error=str(exc))
                return BatchSummary(0, 0, 0.0)
        assert self._dropped is not None
        self._dropped.update(result.dropped)
        samples = result.stored * lm.rollout.n
        return BatchSummary(result.stored, samples, samples / result.seconds if result.seconds > 0 else 0.0,
                            dropped=result.dropped)

    def _policy_to_play(self, pipe: Pipe) -> tuple[str, dict] | None:
        """Online, on a node that is not training: the (peer, policy) of the trainer's newest
        published weights, when a peer gossips one (rollout_worker.py)."""
        cluster = getattr(pipe, "cluster", None)
        if self.lm.grpo.rollouts != "online" or cluster is None or pipe.state.stage is ps.Stage.TRAINING:
            return None
        return trainer_policy(cluster.node.cluster_view(), pipe.node_id)

    def _policy_batch(self, pipe: Pipe, peer: str, policy: dict) -> BatchSummary:
        """A rollout worker's batch: the trainer's newest policy plays it; its groups carry the
        policy's sha256 and version and reach the trainer by replication."""
        lm = self.lm
        tokenizer, task, pool = self._task_kit()
        if self._policy is None:
            server = (lambda path, version, sha: self.engines.policy_server(
                path, version, sha, (pipe.state.best_path, pipe.state.best_generation, pipe.state.best_sha256),
                tokenizer)) if self.engines.first_is_server else None  # the best as it is when the engines are built
            self._policy = PolicyEngine(self.mesh, tokenizer, server)
        if self._policy.played == policy["sha256"]:  # one batch a version: the trainer takes a few groups a step
            time.sleep(IDLE_S)
            return BatchSummary(0, 0, 0.0)
        engine = self._policy.engine_for(pipe.cluster.node, peer, policy)  # type: ignore[attr-defined]
        if engine is None:
            time.sleep(IDLE_S)
            return BatchSummary(0, 0, 0.0)
        size = min(math.ceil(lm.rollout.batch_groups * lm.rollout.oversample), len(pool))
        with RolloutStore(self.paths.rollouts_db) as store:
            self._count_dropped(store, pipe.node_id)
            batch = store.count_settled(pipe.node_id) // size
            result = rollout_batch(
                engine, task, tokenizer, batch_prompts(pool, lm.task.seed, batch, size), rollout_settings(lm.rollout),
                store, node_id=pipe.node_id, model_id=policy["sha256"], seed=batch, model_sha256=policy["sha256"],
                manager=self.filters, rewards=self._reward_pool(), current_version=policy["version"])
        assert self._dropped is not None
        self._dropped.update(result.dropped)
        self.policy_batches += 1
        self._policy.played = policy["sha256"]
        samples = result.stored * lm.rollout.n
        return BatchSummary(result.stored, samples, samples / result.seconds if result.seconds > 0 else 0.0,
                            dropped=result.dropped)

    def _count_dropped(self, store: RolloutStore, node_id: str) -> None:
        if self._dropped is None:
            self._dropped = Counter(store.dropped_counts(node_id))

    def _enough_for_now(self, pipe: Pipe, store: RolloutStore) -> bool:
        """Outside collecting, once a whole export window of the best's groups is stored, more
        would only be thrown away (a promotion makes them stale): self-play idles until the
        generation is decided. With `lm.grpo.rollouts: online` it idles outside collecting
        whatever is stored. In a cluster a node that does not train stays collecting: it rests
        the same way once the cluster has the groups that start the next generation (online,
        that is all they are for; it made ~25 groups a second, all replicated, for nothing)."""
        state = pipe.state
        if state.stage is ps.Stage.COLLECTING:
            cluster = getattr(pipe, "cluster", None)
            if cluster is None or not cluster.next_generation_due():
                return False
        if self.lm.grpo.rollouts == "online":
            return True  # the trainer makes its own groups: these would only pace the next generation
        window = self.lm.export.window_groups
        return len(store.uids_since_version(state.best_generation, window)) >= window

    def close_selfplay(self) -> None:
        """Nothing to free: LM self-play runs in the node's own process (the reward workers are
        the node's, closed with it)."""

    # -- export and training ----------------------------------------------------------------
    def export(self, pipe: Pipe, generation: int, out: Path) -> tuple[str, int]:
        """The newest window of groups no staler than `lm.rollout.max_staleness` generations
        (online: the newest window, at once; the trainer generates its own). Right after a promotion most stored groups are the old model's: the export waits (a
        bounded time) for self-play to bring `min_new_groups` of the new one's. Peers' groups
        arrive by the replication daemon (rollout_replica.py), so there is no pull before it."""
        lm = self.lm
        if out.exists():  # an export interrupted before its stage was recorded: made again
            shutil.rmtree(out)
        online = lm.grpo.rollouts == "online"  # the groups only start the generation: no wait for fresh ones
        min_version = 0 if online else max(0, pipe.state.best_generation - lm.rollout.max_staleness)
        need = 0 if online else min(lm.export.min_new_groups, lm.export.window_groups)
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
                                ModelRef(state.best_path, state.best_generation), rewards=self._reward_pool())
        self._remember_heldout(state, record)
        return record

    def decide(self, pipe: Pipe, state: ps.PipelineState, has_best: bool) -> GateResult:
        """The paired gate, recomputed from the stored per-prompt rewards: a pure function of the
        evaluation and the config, so a restart decides exactly as the first run would have."""
        cfg = self.lm.eval
        rewards = state.evaluation["rewards"]
        return paired_gate(rewards["candidate"], rewards["best"], confidence=cfg.confidence, method=cfg.method,
                           min_improvement=cfg.min_improvement, bootstrap_samples=cfg.bootstrap_samples, seed=cfg.seed)

    def keeps_head(self, pipe: Pipe, state: ps.PipelineState, verdict: Verdict) -> bool:
        """steps.RunsOn: a rejected candidate stays the trainer's head unless it regressed past the
        margin (the mean per-prompt reward against the best's, from the same stored evaluation)."""
        cfg = self.lm.eval
        return cfg.trains_from == "head" and isinstance(verdict, GateResult) \
            and verdict.mean_diff >= -cfg.rollback_margin

    def _remember_heldout(self, state: ps.PipelineState, record: Json) -> None:
        known = self._heldout_known()
        known[state.candidate_sha256 or "?"] = {"generation": state.generation, **record["candidate"]}
        known[state.best_sha256 or INITIAL_MODEL_ID] = {"generation": state.best_generation, **record["best"]}
        atomic_write_json(self.paths.data_dir / HELDOUT_FILE, known, indent=1)

    def _heldout_known(self) -> Json:
        """{sha256: held-out summary} of every model this node evaluated ({} before the first)."""
        path = self.paths.data_dir / HELDOUT_FILE
        return json.loads(path.read_text()) if path.exists() else {}

    # -- the mesh and operators (steps.ReportsStatus) ---------------------------------------
    def routes(self) -> list[web.RouteDef]:
        return self.mesh.routes()

    def close(self) -> None:
        self.mesh.close()
        with self._lock:
            if self._rewards is not None:
                self._rewards.close()
                self._rewards = None

    def node_status(self, pipe: Pipe) -> Json:
        """The inference engines (the weights they serve, whether they are in service), the
        rollout groups this node's filter dropped, by reason, the reward's failures (their
        first lines, and the stop when it failed on every group: app/lm/reward_failures.py) and
        the running training's step, policy version, staleness and held-out curve (run_metrics.py)."""
        state = pipe.state
        rewards = self._rewards
        return {"lm_engines": self.engines.status(state.best_generation, state.best_sha256),
                "lm_rollouts_dropped": dict(self._dropped or {}),
                "lm_reward_failures": rewards.failures.snapshot() if rewards is not None else None,
                "lm_policy_batches": self.policy_batches,
                **training_status(state)}

    def progress_extra(self, pipe: Pipe) -> Json:
        """/progress of a lone node: held-out reward by generation, with its interval."""
        rows = sorted(({"sha256": sha, **v} for sha, v in self._heldout_known().items()), key=lambda r: r["generation"])
        return {"heldout": rows, **training_status(pipe.state)}

    def dashboard(self, pipe: Pipe, inventories: Mapping[str, Json]) -> Json:
        """The dashboard's panel (dashboard_panel.py): this node's own rows read fresh, a cluster's
        held-out rewards from its decided records, a lone node's from what it evaluated."""
        own = training_status(pipe.state)
        rows = training_rows({**inventories, pipe.node_id: {**inventories.get(pipe.node_id, {}), **own}})
        cluster = pipe.cluster
        if cluster is not None:
            summaries = [{"generation": r.generation, "sha256": r.sha256, "promoted": r.promoted, **(r.heldout or {})}
                         for r in cluster.effective_records().values()]
        else:
            summaries = [{"sha256": sha, **v, "low": v["interval"][0], "high": v["interval"][1]}
                         for sha, v in self._heldout_known().items() if isinstance(v.get("interval"), list)]
        return {"training": rows, "heldout": heldout_rows(summaries)}

    def heldout(self, evaluation: Json) -> dict[str, float] | None:
        c = evaluation.get("candidate")
        best = evaluation.get("best")
        if not isinstance(c, dict) or not isinstance(best, dict):
            return None
        return {"reward": c["reward"], "low": c["interval"][0], "high": c["interval"][1],
                "exact_match": c["exact_match"], "best_reward": best["reward"]}


def training_status(state: ps.PipelineState) -> Json:
    """The running training (run_metrics.py) and what it trains from: /status, /progress and the
    dashboard's own row say the same."""
    return {"lm_training": run_progress(state.run_dir), "lm_trains_from": trains_from(state)}


def trains_from(state: ps.PipelineState) -> Json:
    """What the next (or the running) generation trains from, for /status and /progress."""
    if state.head_sha256 is not None:
        return {"model": "head", "generation": state.head_generation, "sha256": state.head_sha256}
    return {"model": "best", "generation": state.best_generation, "sha256": state.best_sha256}
