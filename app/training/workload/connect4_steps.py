"""The Connect Four workload's steps (steps.WorkloadSteps): MCTS self-play into the replay DB,
position datasets, the policy/value trainer, the gauntlet, model files in the model store."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.coordination.pipeline import state as ps
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.evaluation_record import decide_from_evaluation, evaluation_from_report
from app.coordination.pipeline.gauntlet_spread import spread_gauntlet
from app.coordination.pipeline.steps import BatchSummary, Evaluation
from app.coordination.sync import fetch_from_mesh, install_model, is_installed, model_file, sync_from_peers
from app.coordination.sync.dataset_fetch import fetch_dataset
from app.coordination.sync.model_store import installed_models
from app.coordination.sync.replica_store import GameStore
from app.db.registry import ModelRegistry
from app.db.replay_db import ReplayDB
from app.training.export import WindowGrowth, export_dataset
from app.training.gauntlet import run_gauntlet
from app.training.promotion import Decision, Gates, register_candidate
from app.training.selfplay import run_selfplay
from app.training.selfplay_pool import WorkerPool
from app.training.train import CANDIDATE_NAME, RESULT_NAME

if TYPE_CHECKING:
    from app.coordination.daemons.daemon_registry import DaemonContext


class Connect4Steps:
    """The AlphaZero loop: MCTS self-play into the replay DB, model files in the model store."""

    name = "connect4"
    train_module = "app.training.train"
    candidate_name = CANDIDATE_NAME
    result_name = RESULT_NAME

    def __init__(self) -> None:
        self._pool: WorkerPool | None = None  # self-play workers, kept from batch to batch

    def selfplay_batch(self, pipe: PipelineContext, cfg: dict, should_stop: Callable[[], bool]) -> BatchSummary:
        sp = pipe.settings.selfplay
        workers = max(sp.workers, sp.collect_workers) if sp.workers else 0  # 0: inline, no pool
        active = None
        if workers:
            self._pool = self._pool or WorkerPool(workers)
            active = ps.selfplay_workers(pipe.state, pipe.newest_game_id(), pipe.export_threshold, sp.workers,
                                         sp.collect_workers, clustered=pipe.cluster is not None)
        summary = run_selfplay(
            games=cfg["batch_games"], simulations=cfg["simulations"] or pipe.settings.search.simulations,
            db_path=pipe.paths.games_db, model_path=pipe.state.best_path, workers=workers,
            seed=random.randrange(2**31), node_id=pipe.node_id, settings=pipe.settings, should_stop=should_stop,
            pool=self._pool, active_workers=active)
        return BatchSummary(summary.games, summary.positions, summary.positions_per_second, active or 1)

    def close_selfplay(self, pipe: PipelineContext) -> None:
        """The self-play daemon stopped: its worker processes exit (a restart starts new ones)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    def newest_item_id(self, pipe: PipelineContext) -> int:
        with ReplayDB(pipe.paths.games_db) as db:
            return db.max_id()

    def created_counts(self, pipe: PipelineContext) -> dict[str, int]:
        with ReplayDB(pipe.paths.games_db) as db:
            return {"games_created": db.count_by_node(pipe.node_id),
                    "positions_created": db.count_positions(pipe.node_id), "games_max_id": db.max_id()}

    def export_threshold(self, pipe: PipelineContext, daemon_settings: dict) -> int:
        return int(daemon_settings["min_new_games"])

    async def sync_before_export(self, pipe: PipelineContext, budget_s: float) -> dict[str, Any]:
        reports = await sync_from_peers(pipe.cluster.node, pipe.paths.games_db, pipe.paths.data_dir / "sync",
                                        budget_s=budget_s)
        return {"new": sum(r.new for r in reports), "errors": [r.error for r in reports if r.error]}

    def export(self, pipe: PipelineContext, generation: int, out: Path) -> tuple[str, int]:
        cfg = pipe.settings.export
        result = export_dataset(
            [pipe.paths.games_db], out, window_games=cfg.window_games, holdout_fraction=cfg.holdout_fraction,
            augment=cfg.augment, overwrite=True, value_target_mix=cfg.value_target_mix,
            length_discount=pipe.settings.search.length_discount,
            window_growth=WindowGrowth.from_config(cfg.window_base_games, cfg.window_alpha, cfg.window_beta))
        return result.dataset_sha256, int(result.manifest["counts"]["games"])

    def final_loss(self, result: dict) -> float | None:
        return result.get("best_holdout_loss")

    def register_candidate(self, pipe: PipelineContext, path: str) -> str:
        with ModelRegistry(pipe.paths.registry_db) as registry:
            return register_candidate(registry, path).sha256

    async def evaluate(self, pipe: PipelineContext, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation:
        """The gauntlet (raises GauntletStopped when the daemon is stopping)."""
        gates = generation_gates(pipe, state.generation)
        report = await (spread_gauntlet(  # cluster: baseline games spread over the nodes
            pipe, state, gates.baselines(), pipe.settings.gauntlet.workers, ctx.stopping.is_set,
        ) if pipe.cluster is not None else asyncio.to_thread(
            run_gauntlet, state.candidate_path, gates.baselines(), state.best_path, pipe.settings,
            pipe.paths.registry_db, workers=pipe.settings.gauntlet.workers, seed=state.generation,
            should_stop=ctx.stopping.is_set,
        ))
        candidate = next((r for r in report.ratings if r.player == report.candidate), None)
        if candidate is not None:
            ctx.metrics.elo.labels(str(state.generation)).set(candidate.elo)
        record = evaluation_from_report(report)
        passed = decide_from_evaluation(record, gates, has_best=state.best_sha256 is not None).promote
        results = {r["kind"]: {k: r[k] for k in ("wins", "draws", "losses", "score")} for r in record["results"]}
        return Evaluation(record, passed, results)

    def decide(self, pipe: PipelineContext, state: ps.PipelineState, has_best: bool) -> Decision:
        return decide_from_evaluation(state.evaluation, generation_gates(pipe, state.generation), has_best=has_best)

    def heldout(self, evaluation: dict) -> dict[str, float] | None:
        return None

    def install(self, pipe: PipelineContext, path: str | Path, sha256: str) -> Path:
        return install_model(path, pipe.paths.models_dir, sha256)

    def installed_path(self, pipe: PipelineContext, sha256: str) -> Path:
        return model_file(pipe.paths.models_dir, sha256)

    def is_installed(self, pipe: PipelineContext, sha256: str) -> bool:
        return is_installed(pipe.paths.models_dir, sha256)

    def installed_models(self, pipe: PipelineContext) -> list[str]:
        return installed_models(pipe.paths.models_dir)

    async def fetch(self, pipe: PipelineContext, sha256: str) -> Path:
        return await fetch_from_mesh(pipe.cluster.node, sha256, pipe.paths.models_dir)

    async def fetch_dataset(self, pipe: PipelineContext, sha256: str, peer_addrs: list[str]) -> Path:
        """A joiner of a spanned run: the claimant's dataset (served by the orchestrator's dataset_routes)."""
        return await fetch_dataset(pipe.cluster.node.client, sha256, peer_addrs, pipe.paths.datasets_dir)

    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str:
        return register_candidate(registry, path).sha256  # lineage from the model's sidecar

    async def switched(self, pipe: PipelineContext, sha256: str, path: Path, generation: int) -> None:
        """Self-play reads the best model's path from the pipeline state: nothing else to do."""

    def node_status(self, pipe: PipelineContext) -> dict[str, Any]:
        return {}

    def progress_extra(self, pipe: PipelineContext, report: dict) -> dict[str, Any]:
        return {}

    def routes(self, pipe: PipelineContext) -> list:
        return []  # the model store's routes are the orchestrator's own (model_routes)

    def replica_store(self, pipe: PipelineContext) -> tuple[str, Any]:
        """What the replication daemon keeps on `replication.factor` nodes: the games."""
        return "games", GameStore(pipe.paths.games_db)


def generation_gates(pipe: PipelineContext, generation: int) -> Gates:
    return Gates.from_config(pipe.settings.promotion, generation)
