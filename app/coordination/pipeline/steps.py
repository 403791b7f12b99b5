"""The seam between the pipeline daemons and a workload: what self-play, export, training,
evaluation and the model store mean for the game or task this node runs.

The daemons (runners.py) own the flow: stages, claims, quorum decisions, events, restarts.
A `WorkloadSteps` owns the content of each step: the game workload (app/games/workload/) plays
games with MCTS, exports position datasets, trains a policy/value net, runs a gauntlet and keeps
model files; the language-model workload (app/lm/workload/) generates scored rollout groups,
exports them, trains GRPO, gates on held-out prompts and keeps Hugging Face directories. One
daemon stack, one mesh, two workloads: nothing in the runners knows which one it drives.

The seam is small: the steps themselves, and three parts behind them (`training`: what the
train daemon launches and reads back; `items`: what self-play stores; `models`: where promoted
models live on a node and what a switch does). What only some workloads do is an optional
capability a runner asks for (`PullsBeforeExport`, `ReportsStatus`, `RunsOn`). A workload reads the
node's pipeline through `Pipe` (PipelineContext is one), never more.

Each step is called from the event loop through `asyncio.to_thread` where it blocks, except
the async ones (evaluation, fetching, the switch), which talk to the mesh themselves.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TypedDict, runtime_checkable

from aiohttp import web

from app.config import Settings
from app.config.paths import NodePaths
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.worker import Claim, WorkClient
from app.coordination.pipeline import state as ps
from app.coordination.pipeline.feedback_loops import DataQuality
from app.coordination.pipeline.generation_log import GenerationLog, GenerationRecord
from app.coordination.pipeline.rollback import RollbackLog
from app.coordination.pipeline.runner_settings import ExportSettings, SelfplaySettings
from app.coordination.pipeline.shard_board import ShardBoard
from app.coordination.sync.replica_store import ReplicatedStore
from app.db.registry import ModelRegistry

Json = dict[str, object]  # a JSON object as the pipeline stores or gossips it


@dataclass(frozen=True)
class BatchSummary:
    """One self-play batch: items (games or rollout groups) stored, samples (positions or
    completions) in them, and items played but dropped by a filter, by reason."""

    items: int
    samples: int
    samples_per_second: float
    workers: int = 1  # processes that played it (a lone node's idle core joins while it collects)
    dropped: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Evaluation:
    """A candidate's evaluation: the JSON the stage keeps, whether it passed, and the per-
    opponent results the EVALUATION_COMPLETED event carries."""

    record: Json
    passed: bool
    results: dict[str, dict[str, float]]


class Verdict(Protocol):
    """A promotion decision as the pipeline records it: promote or not, and why in one line."""

    @property
    def promote(self) -> bool: ...

    def summary(self) -> str: ...


@dataclass(frozen=True)
class TrainingJob:
    """What the train daemon launches for one generation and reads back from its run dir."""

    module: str  # the `python -m` module the launcher runs under torchrun
    loss_key: str  # result.json's key of the run's final loss
    candidate_name: str = "candidate"
    result_name: str = "result.json"
    # passed with the node's data dir when it has peers: the trainer finds the node's stores
    # there, whatever config file or `--data-dir` the node was started with
    mesh_flag: str | None = None
    # passed with the run dir on this node that made the parent, when there is one: the trainer
    # continues its optimizer's state (a workload whose trainer runs on, steps.RunsOn)
    continue_flag: str | None = None
    # passed with a file on a lone node: the trainer stays after its generation and takes the
    # next one written there (app/shared/trainer_follow.py, resident_trainer.py)
    follow_flag: str | None = None
    # a run dir's checkpoints (glob patterns of files or dirs): removed once the generation is
    # decided and its run made neither the best nor the head (retention.py)
    checkpoint_names: tuple[str, ...] = ()

    def final_loss(self, result: Mapping[str, object]) -> float | None:
        value = result.get(self.loss_key)
        return float(value) if isinstance(value, (int, float)) else None


class CreatedCounts(TypedDict):
    """What this node's self-play made, as gossiped (the keys keep the game workload's names)."""

    games_created: int  # items: games or rollout groups
    positions_created: int  # samples: positions or completions
    games_max_id: int


class ItemStore(Protocol):
    """What self-play stores on this node: games (the replay DB) or rollout groups."""

    def newest_id(self) -> int: ...  # the export's counter: items since the last dataset
    def created_counts(self, node_id: str) -> CreatedCounts: ...
    def replica(self) -> tuple[str, ReplicatedStore]: ...  # what the replication daemon keeps on `factor` nodes


class ModelStore(Protocol):
    """Promoted models on this node: installed by sha256, fetched from peers, switched to."""

    def install(self, path: str | Path, sha256: str) -> Path: ...
    def installed_path(self, sha256: str) -> Path: ...
    def is_installed(self, sha256: str) -> bool: ...
    def installed(self) -> list[str]: ...
    def remove(self, sha256: str) -> int: ...  # bytes freed; a model no decision keeps (retention.py)
    def register_candidate(self, registry: ModelRegistry, path: str | Path, generation: int) -> str: ...
    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str: ...
    async def fetch(self, node: MeshNode, sha256: str) -> Path: ...
    async def switched(self, sha256: str, path: Path, generation: int) -> None: ...  # the node now plays it


@dataclass
class GenerationClaim:
    """A generation this node claimed from the leader to export, train and evaluate."""

    claim: Claim
    generation: int
    games_mark: int


class Cluster(Protocol):
    """What the pipeline uses of the cluster side (cluster.ClusterPipeline) on a node with peers."""

    node: MeshNode
    current: GenerationClaim | None
    generations: GenerationLog
    rollbacks: RollbackLog
    gauntlet: ShardBoard
    replication: Json | None  # the replication daemon's latest counts, gossiped

    def work_client(self) -> WorkClient: ...
    def target_best(self) -> GenerationRecord | None: ...
    def trainer_head(self) -> GenerationRecord | None: ...
    def effective_records(self) -> dict[int, GenerationRecord]: ...
    def next_generation_due(self) -> bool: ...
    async def claim_generation(self) -> GenerationClaim | None: ...
    async def propose(self, record: GenerationRecord) -> tuple[bool, str]: ...
    def announce_rendezvous(self, rendezvous: Json | None) -> None: ...


class Pipe(Protocol):
    """What a workload's steps read of the node's pipeline (context.PipelineContext)."""

    settings: Settings
    paths: NodePaths
    cluster: Cluster | None

    @property
    def node_id(self) -> str: ...

    @property
    def state(self) -> ps.PipelineState: ...

    @property
    def export_threshold(self) -> int: ...


class WorkloadSteps(Protocol):
    name: str
    training: TrainingJob
    items: ItemStore
    models: ModelStore

    def export_threshold(self, export: ExportSettings) -> int: ...  # new items that start a generation
    def selfplay_batch(self, pipe: Pipe, settings: SelfplaySettings, should_stop: Callable[[], bool]) -> BatchSummary: ...
    def close_selfplay(self) -> None: ...  # the self-play daemon stopped: free its workers
    def export(self, pipe: Pipe, generation: int, out: Path) -> tuple[str, int]: ...  # (dataset sha256, items)
    async def fetch_dataset(self, node: MeshNode, sha256: str, peer_addrs: list[str]) -> Path: ...  # a joiner's
    async def evaluate(self, pipe: Pipe, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation: ...
    def decide(self, pipe: Pipe, state: ps.PipelineState, has_best: bool) -> Verdict: ...
    def routes(self) -> list[web.RouteDef]: ...  # the mesh routes this workload serves (signed)
    def close(self) -> None: ...  # the node stops: close what the routes hold open


@runtime_checkable
class PullsBeforeExport(Protocol):
    """A claimant pulls the items it lacks before it exports (games; rollouts arrive by replication)."""

    async def sync_before_export(self, node: MeshNode, budget_s: float) -> Json: ...


@runtime_checkable
class RunsOn(Protocol):
    """A workload whose trainer runs on from a rejected candidate (a language model's GRPO, as
    the field trains it) instead of starting each generation from the best (AlphaZero's shape)."""

    def keeps_head(self, pipe: Pipe, state: ps.PipelineState, verdict: Verdict) -> bool: ...


@runtime_checkable
class ScoresData(Protocol):
    """A workload whose exports measure their own quality (the quality -> training loop)."""

    def data_quality(self, dataset_dir: Path) -> DataQuality | None: ...


@runtime_checkable
class ReportsStatus(Protocol):
    """What a workload adds to /status (gossiped), /progress, and a decided generation's record."""

    def node_status(self, pipe: Pipe) -> Json: ...
    def progress_extra(self, pipe: Pipe) -> Json: ...
    def heldout(self, evaluation: Json) -> dict[str, float] | None: ...
    def dashboard(self, pipe: Pipe, inventories: Mapping[str, Json]) -> Json: ...  # its panel on the page
