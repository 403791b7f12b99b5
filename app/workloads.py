"""Which steps a node's pipeline runs: its configured `workload:` (connect4 or lm)."""

from __future__ import annotations

from pathlib import Path

from app.config import Settings
from app.training.workload.connect4_steps import Connect4Steps
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.steps import WorkloadSteps


def pipeline_context(settings: Settings, config_path: Path | None = None) -> PipelineContext:
    """The node's pipeline context, with the steps of its configured workload."""
    return PipelineContext(settings, steps_for(settings.workload), config_path=config_path)


def steps_for(workload: str) -> WorkloadSteps:
    """The steps of a node's configured workload (`workload:` in its config)."""
    if workload == "connect4":
        return Connect4Steps()
    if workload == "lm":
        from app.lm.workload.lm_steps import LMSteps  # transformers: imported only on lm nodes

        return LMSteps()
    raise ValueError(f"unknown workload {workload!r}: expected connect4 or lm")
