"""The game workload's steps (app/coordination/pipeline/steps.py), for whatever game
`node.game` names (app/games: a registered game or a user's by import path): MCTS self-play into
the replay DB, position datasets, the policy/value trainer, the gauntlet, model files in the
model store, and the mesh routes that serve games, models and datasets to peers."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from app.config import Settings
from app.config.paths import NodePaths
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.p2p.node import MeshNode
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.feedback_apply import exploration
from app.coordination.pipeline.feedback_loops import DataQuality, explore_settings
from app.coordination.pipeline.evaluation_record import decide_from_evaluation, evaluation_from_report
from app.coordination.pipeline.gauntlet_spread import spread_gauntlet
from app.coordination.pipeline.runner_settings import ExportSettings, SelfplaySettings
from app.coordination.pipeline.steps import BatchSummary, CreatedCounts, Evaluation, Json, Pipe, TrainingJob
from app.coordination.sync import fetch_from_mesh, install_model, is_installed, model_file, model_routes, sync_from_peers
from app.coordination.sync.dataset_fetch import fetch_dataset
from app.coordination.sync.dataset_server import dataset_routes
from app.coordination.sync.game_server import GameSyncServer
from app.coordination.sync.model_store import installed_models, remove_model
from app.coordination.sync.replica_store import GameStore, ReplicatedStore
from app.db.registry import ModelRegistry
from app.db.replay_db import ReplayDB
from app.games.train.dataset import MANIFEST_NAME
from app.games.train.export import WindowGrowth, export_dataset
from app.games.train.gauntlet import run_gauntlet
from app.games.train.gauntlet_baselines import planned_baselines
from app.games.train.promotion import Decision, Gates, register_candidate
from app.games.train.selfplay import run_selfplay
from app.games.train.selfplay_pool import WorkerPool
from app.games.train.run_files import CANDIDATE_NAME, RESULT_NAME


class GameItems:
    """Self-play's games in the replay DB.

    The counts are read every few seconds (the node's status and gossip), so they go through
    the node's one open handle (`db`, the game server's) rather than opening the database,
    checking its schema and closing it each time: that was most of an idle node's CPU."""

    def __init__(self, paths: NodePaths, db: Callable[[], ReplayDB]) -> None:
        self.games_db = paths.games_db
        self.db = db

    def newest_id(self) -> int:
        return self.db().max_id()

    def created_counts(self, node_id: str) -> CreatedCounts:
        db = self.db()
        return {"games_created": db.count_by_node(node_id), "positions_created": db.count_positions(node_id),
                "games_max_id": db.max_id()}

    def replica(self) -> tuple[str, ReplicatedStore]:
        """What the replication daemon keeps on `replication.factor` nodes: the games."""
        return "games", GameStore(self.games_db)


class ModelFiles:
    """Promoted networks as `<models>/<sha256>.safetensors` (app/coordination/sync/model_store.py)."""

    def __init__(self, paths: NodePaths) -> None:
        self.models_dir = paths.models_dir

    def install(self, path: str | Path, sha256: str) -> Path:
        return install_model(path, self.models_dir, sha256)

    def installed_path(self, sha256: str) -> Path:
        return model_file(self.models_dir, sha256)

    def is_installed(self, sha256: str) -> bool:
        return is_installed(self.models_dir, sha256)

    def installed(self) -> list[str]:
        return installed_models(self.models_dir)

    def remove(self, sha256: str) -> int:
        return remove_model(self.models_dir, sha256)

    def register_candidate(self, registry: ModelRegistry, path: str | Path, generation: int) -> str:
        return register_candidate(registry, path).sha256  # generation and lineage from the model's sidecar

    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str:
        return register_candidate(registry, path).sha256

    async def fetch(self, node: MeshNode, sha256: str) -> Path:
        return await fetch_from_mesh(node, sha256, self.models_dir)

    async def switched(self, sha256: str, path: Path, generation: int) -> None:
        """Self-play reads the best model's path from the pipeline state: nothing else to do."""


class GameSteps:
    """The AlphaZero loop: MCTS self-play into the replay DB, model files in the model store."""

    name = "games"  # the seam's name for it; the config's `workload:` keeps its first name
    training = TrainingJob("app.games.train.train", loss_key="best_holdout_loss", candidate_name=CANDIDATE_NAME,
                           result_name=RESULT_NAME, checkpoint_names=("checkpoint*.pt",))

    def __init__(self, settings: Settings) -> None:
        self.paths = NodePaths(Path(settings.node.data_dir), settings.node.db_url)
        self._games = GameSyncServer(self.paths.games_db)  # opens the replay DB on its first use
        self.items = GameItems(self.paths, self._games.db)
        self.models = ModelFiles(self.paths)
        self._pool: WorkerPool | None = None  # self-play workers, kept from batch to batch

    def export_threshold(self, export: ExportSettings) -> int:
        return export.min_new_games

    def selfplay_batch(self, pipe: Pipe, settings: SelfplaySettings, should_stop: Callable[[], bool]) -> BatchSummary:
        sp = pipe.settings.selfplay
        workers = max(sp.workers, sp.collect_workers) if sp.workers else 0  # 0: inline, no pool
        active = None
        if workers:
            self._pool = self._pool or WorkerPool(workers)
            active = ps.selfplay_workers(pipe.state, self.items.newest_id(), pipe.export_threshold, sp.workers,
                                         sp.collect_workers, clustered=pipe.cluster is not None)
        summary = run_selfplay(
            games=settings.batch_games, simulations=settings.simulations or pipe.settings.search.simulations,
            db_path=self.paths.games_db, model_path=pipe.state.best_path, workers=workers,
            seed=random.randrange(2**31), node_id=pipe.node_id, should_stop=should_stop,
            settings=explore_settings(pipe.settings, exploration(pipe)),  # the plateau loop's noise, when on
            pool=self._pool, active_workers=active)
        return BatchSummary(summary.games, summary.positions, summary.positions_per_second, active or 1)

    def close_selfplay(self) -> None:
        """The self-play daemon stopped: its worker processes exit (a restart starts new ones)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()

    async def sync_before_export(self, node: MeshNode, budget_s: float) -> Json:
        """A claimant pulls the games it still lacks (most arrived by replication already)."""
        reports = await sync_from_peers(node, self.paths.games_db, self.paths.data_dir / "sync", budget_s=budget_s)
        return {"new": sum(r.new for r in reports), "errors": [r.error for r in reports if r.error]}

    def export(self, pipe: Pipe, generation: int, out: Path) -> tuple[str, int]:
        cfg = pipe.settings.export
        result = export_dataset(
            [self.paths.games_db], out, window_games=cfg.window_games, holdout_fraction=cfg.holdout_fraction,
            augment=cfg.augment, overwrite=True, value_target_mix=cfg.value_target_mix,
            length_discount=pipe.settings.search.length_discount,
            window_growth=WindowGrowth.from_config(cfg.window_base_games, cfg.window_alpha, cfg.window_beta))
        return result.dataset_sha256, int(result.manifest["counts"]["games"])

    def data_quality(self, dataset_dir: Path) -> DataQuality | None:
        """The quality the export measured of its games (the manifest's `quality`)."""
        try:
            manifest = json.loads((dataset_dir / MANIFEST_NAME).read_text())
        except (OSError, ValueError):
            return None
        return DataQuality.from_json(manifest.get("quality")) if isinstance(manifest, dict) else None

    async def fetch_dataset(self, node: MeshNode, sha256: str, peer_addrs: list[str]) -> Path:
        """A joiner of a spanned run: the claimant's dataset (served by `routes`)."""
        return await fetch_dataset(node.client, sha256, peer_addrs, self.paths.datasets_dir)

    async def evaluate(self, pipe: Pipe, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation:
        """The gauntlet (raises GauntletStopped when the daemon is stopping)."""
        gates = generation_gates(pipe, state.generation)
        baselines = planned_baselines(gates.baselines(), pipe.settings)  # the gate's and the fixed anchor
        report = await (spread_gauntlet(  # cluster: baseline games spread over the nodes
            pipe, state, baselines, pipe.settings.gauntlet.workers, ctx.stopping.is_set,
        ) if pipe.cluster is not None else asyncio.to_thread(
            run_gauntlet, state.candidate_path, baselines, state.best_path, pipe.settings,
            self.paths.registry_db, workers=pipe.settings.gauntlet.workers, seed=state.generation,
            should_stop=ctx.stopping.is_set,
        ))
        record = evaluation_from_report(report)
        passed = decide_from_evaluation(record, gates, has_best=state.best_sha256 is not None).promote
        results = {r["kind"]: {k: r[k] for k in ("wins", "draws", "losses", "score")} for r in record["results"]}
        return Evaluation(record, passed, results)

    def decide(self, pipe: Pipe, state: ps.PipelineState, has_best: bool) -> Decision:
        return decide_from_evaluation(state.evaluation, generation_gates(pipe, state.generation), has_best=has_best)

    def routes(self) -> list[web.RouteDef]:
        """Games (pulled by a claimant), model files by sha256, and datasets for the joiners of
        a spanned training run."""
        return [*self._games.routes(), *model_routes(self.paths.models_dir), *dataset_routes(self.paths.datasets_dir)]

    def close(self) -> None:
        """The node stops: the replay DB handle (the game server's, the counts') is closed."""
        self._games.close()


def generation_gates(pipe: Pipe, generation: int) -> Gates:
    return Gates.from_config(pipe.settings.promotion, generation)
