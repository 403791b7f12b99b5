"""The workload behind the pipeline daemons: what self-play, export, training, evaluation and
the model store mean for the game or task this node runs.

The daemons (runners.py) own the flow: stages, claims, quorum decisions, events, restarts.
A `WorkloadSteps` owns the content of each step. Connect Four (this module) plays games with
MCTS, exports position datasets, trains a policy/value net, runs a gauntlet and keeps model
files (connect4_steps.py); the language-model workload (lm_steps.py) generates scored rollout groups, exports
them, trains GRPO, gates on held-out prompts and keeps Hugging Face directories. One daemon
stack, one mesh, two workloads: nothing in the runners knows which one it drives.

Each step is called from the event loop through `asyncio.to_thread` where it blocks, except
the async ones (evaluation, fetching, engine sync), which talk to the mesh themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from app.coordination.pipeline import state as ps
from app.coordination.pipeline.context import PipelineContext
from app.db.registry import ModelRegistry

if TYPE_CHECKING:
    from app.coordination.daemons.daemon_registry import DaemonContext


@dataclass(frozen=True)
class BatchSummary:
    """One self-play batch: games (or rollout groups) stored, positions (or samples) in them."""

    items: int
    positions: int
    positions_per_second: float
    workers: int = 1  # processes that played it (a lone node's idle core joins while it collects)


@dataclass(frozen=True)
class Evaluation:
    """A candidate's evaluation: the JSON the stage keeps, whether it passed, and the per-
    opponent results the EVALUATION_COMPLETED event carries."""

    record: dict[str, Any]
    passed: bool
    results: dict[str, dict[str, Any]]


class Verdict(Protocol):
    """A promotion decision as the pipeline records it: promote or not, and why in one line."""

    @property
    def promote(self) -> bool: ...

    def summary(self) -> str: ...


class WorkloadSteps(Protocol):
    name: str
    train_module: str  # the `python -m` module the launcher runs for one generation's training
    candidate_name: str  # what the training run writes in its run dir
    result_name: str

    def selfplay_batch(self, pipe: PipelineContext, cfg: dict, should_stop: Callable[[], bool]) -> BatchSummary: ...
    def close_selfplay(self, pipe: PipelineContext) -> None: ...  # the self-play daemon stopped: free its workers
    def newest_item_id(self, pipe: PipelineContext) -> int: ...
    def created_counts(self, pipe: PipelineContext) -> dict[str, int]: ...
    def export_threshold(self, pipe: PipelineContext, daemon_settings: dict) -> int: ...
    async def sync_before_export(self, pipe: PipelineContext, budget_s: float) -> dict[str, Any]: ...
    def export(self, pipe: PipelineContext, generation: int, out: Path) -> tuple[str, int]: ...
    def final_loss(self, result: dict) -> float | None: ...
    def register_candidate(self, pipe: PipelineContext, path: str) -> str: ...
    async def evaluate(self, pipe: PipelineContext, state: ps.PipelineState, ctx: DaemonContext) -> Evaluation: ...
    def decide(self, pipe: PipelineContext, state: ps.PipelineState, has_best: bool) -> Verdict: ...
    def heldout(self, evaluation: dict) -> dict[str, float] | None: ...
    def install(self, pipe: PipelineContext, path: str | Path, sha256: str) -> Path: ...
    def installed_path(self, pipe: PipelineContext, sha256: str) -> Path: ...
    def is_installed(self, pipe: PipelineContext, sha256: str) -> bool: ...
    def installed_models(self, pipe: PipelineContext) -> list[str]: ...
    async def fetch(self, pipe: PipelineContext, sha256: str) -> Path: ...
    async def fetch_dataset(self, pipe: PipelineContext, sha256: str, peer_addrs: list[str]) -> Path: ...
    def register_installed(self, registry: ModelRegistry, path: Path, generation: int) -> str: ...
    async def switched(self, pipe: PipelineContext, sha256: str, path: Path, generation: int) -> None: ...
    def node_status(self, pipe: PipelineContext) -> dict[str, Any]: ...
    def progress_extra(self, pipe: PipelineContext, report: dict) -> dict[str, Any]: ...
    def routes(self, pipe: PipelineContext) -> list: ...
    def replica_store(self, pipe: PipelineContext) -> tuple[str, Any]: ...
