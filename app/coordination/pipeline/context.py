"""What the pipeline daemons of one node share: the workload, file layout, the persisted
stage, the export threshold, wake-ups.

The daemons never call each other. They share this object only for reading the persisted
`PipelineState` and applying pure transitions to it under one lock, so two daemons cannot
interleave a read-modify-write; everything else between them goes over the event router.
Everything else on it is fixed when the node starts.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from app.config import Settings
from app.config.paths import NodePaths
from app.coordination.daemons.daemon_registry import DaemonContext
from app.coordination.daemons.event_router import Event
from app.coordination.daemons.events import EventType
from app.coordination.pipeline.state import PipelineState, PipelineStateStore
from app.coordination.pipeline.steps import Cluster, WorkloadSteps
from app.log import iso_timestamp

TEST_HOLD_ENV = "SELFPLAY_MESH_TEST_HOLD_STAGE"  # see PipelineContext._test_hold; unset in production


class PipelineContext:
    """One per node process; created by the orchestrator (app/workloads.py: pipeline_context)
    and handed to the pipeline runners. It is the `steps.Pipe` a workload's steps read."""

    def __init__(self, settings: Settings, steps: WorkloadSteps, export_threshold: int,
                 config_path: Path | None = None) -> None:
        self.settings = settings
        self.config_path = config_path  # handed to training subprocesses (model/train sections)
        self.paths = NodePaths(Path(settings.node.data_dir), settings.node.db_url)
        self.paths.data_dir.mkdir(parents=True, exist_ok=True)
        self._store = PipelineStateStore(self.paths.state_file)
        self._state = self._store.load()
        self._lock = asyncio.Lock()
        self._changed = asyncio.Condition()
        self.cluster: Cluster | None = None  # a ClusterPipeline when the node is part of a mesh with peers
        self.steps = steps  # what each stage does for this node's workload
        # new items (games, rollout groups) that start a generation on a lone node, and where the
        # leader schedules one in a cluster: the workload's reading of its setting, made once
        self._export_threshold = export_threshold
        # the node's drain has begun (the orchestrator hands in DaemonManager.wait_draining); only
        # the test fault point `_test_hold` waits on it
        self.wait_draining: Callable[[], Awaitable[None]] | None = None
        # several configs on the node (app/config/configs.py): this lineage's config, and the
        # gate the lineages share (lineage_gate.LineageGate: self-play turns, training claims);
        # None with one config, where nothing waits on another lineage
        self.config_name: str | None = None
        self.gate: Any = None
        # what a node must offer to claim this lineage's training (configs' `requires`; {}: any node)
        self.requirements: dict[str, Any] = {}

    def save_state(self) -> None:
        """Write the state as it is (the start-up migration of an old data dir's paths)."""
        self._store.save(self._state)

    @property
    def export_threshold(self) -> int:
        return self._export_threshold

    @property
    def node_id(self) -> str:
        return self.settings.node.node_id

    @property
    def state(self) -> PipelineState:
        return self._state

    async def update(self, transition: Callable[[PipelineState], PipelineState]) -> PipelineState:
        """Apply a pure transition and persist it before anyone sees the new state."""
        await self._test_hold(transition)
        async with self._lock:
            old = self._state
            new = transition(old)
            await asyncio.to_thread(self._store.save, new)
            self._state = new
            if (new.stage, new.generation) != (old.stage, old.generation):
                await asyncio.to_thread(self._append_history, new)
        async with self._changed:
            self._changed.notify_all()
        return new

    async def _test_hold(self, transition: Callable[[PipelineState], PipelineState]) -> None:
        """Test fault point, off unless the environment sets it: with
        `SELFPLAY_MESH_TEST_HOLD_STAGE=<stage>`, a transition that would move the state out of
        that stage never happens; the daemon asking for it waits (until the node is stopped or
        killed) after writing `<data_dir>/test_hold_<stage>`, so a test can stop or kill the node
        parked exactly there (tests/test_pipeline_resume_e2e.py, every stage, SIGTERM and
        kill -9). The work of the stage is done by then; only its record is held back. When the
        node drains, the waiting daemon ends as cancelled at once (the transition still never
        happens) instead of sitting out its stop timeout."""
        stage = os.environ.get(TEST_HOLD_ENV)
        if not stage or self._state.stage.value != stage:
            return
        if transition(self._state).stage.value == stage:
            return  # stays in the stage (a resumed run): nothing to hold
        marker = self.paths.data_dir / f"test_hold_{stage}"
        await asyncio.to_thread(marker.write_text, f"{self._state.generation}\n")
        if self.wait_draining is not None:
            await self.wait_draining()
            raise asyncio.CancelledError("held at a test hold when the node drained")
        await asyncio.Event().wait()  # nothing tells this context of a drain: until cancelled

    async def wait_for_change(self, timeout_s: float) -> None:
        """Return when the state changes or after `timeout_s`, whichever comes first."""
        async with self._changed:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except TimeoutError:
                pass

    def _append_history(self, state: PipelineState) -> None:
        """One JSON line per stage change: when each generation entered each stage (for
        operators and scripts/bench_loop.py's time shares)."""
        line = json.dumps({"timestamp": iso_timestamp(time.time()), "generation": state.generation, "stage": state.stage.value,
                           "promoted": state.promoted, "rejected": state.rejected})
        with open(self.paths.history_file, "a") as fh:
            fh.write(line + "\n")

    def decided_generations(self) -> int:
        """Generations promoted or rejected: by this node alone, or by the whole cluster."""
        if self.cluster is not None:
            return len(self.cluster.generations.records)
        return self._state.decided

    def newest_item_id(self) -> int:
        """The newest stored game's (or rollout group's) row id: the export's counter."""
        return self.steps.items.newest_id()


def wake_on(ctx: DaemonContext, *event_types: EventType) -> asyncio.Event:
    """An asyncio.Event set whenever one of `event_types` is published.

    The handler only sets a flag, so it never hits the router's handler timeout however long
    the daemon's real work (training, a gauntlet) takes; the runner's loop does the work.
    """
    wake = asyncio.Event()

    async def handler(_event: Event) -> None:
        wake.set()

    for event_type in event_types:
        name = f"{ctx.name}.wake.{event_type.value}"
        ctx.router.unsubscribe(event_type, name)  # a restarted daemon replaces its old handler
        ctx.router.subscribe(event_type, handler, name=name)
    return wake


async def wait_for_wake(ctx: DaemonContext, wake: asyncio.Event, timeout_s: float) -> bool:
    """Sleep until woken, stopped or `timeout_s`; True when the daemon should stop."""
    stop_task = asyncio.ensure_future(ctx.stopping.wait())
    wake_task = asyncio.ensure_future(wake.wait())
    try:
        await asyncio.wait({stop_task, wake_task}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop_task.cancel()
        wake_task.cancel()
    wake.clear()
    return ctx.stopping.is_set()
