"""Which workload a node's pipeline runs: its configured `workload:` (the game workload, for
any game `node.game` names, under its first name in the config; or `lm`).

The one place that knows both workloads. It builds the workload's steps (the seam of
app/coordination/pipeline/steps.py) and the node's PipelineContext, with the export threshold
read once from the workload's own setting: the game workload's `export.settings.min_new_games` in
daemons.yaml, the language model's `lm.export.min_new_groups` (an lm node that sets
`min_new_games` is refused: the setting would not act).
"""

from __future__ import annotations

from pathlib import Path

from app.config import ConfigError, Settings
from app.coordination.pipeline.context import PipelineContext
from app.coordination.pipeline.runner_settings import ExportSettings
from app.coordination.pipeline.steps import WorkloadSteps
from app.games.workload.game_steps import GameSteps


def pipeline_context(settings: Settings, config_path: Path | None = None,
                     export: ExportSettings | None = None) -> PipelineContext:
    """The node's pipeline context, with the steps of its configured workload; `export`: the
    export daemon's settings from daemons.yaml (their defaults without one)."""
    steps = workload_steps(settings)
    export = export if export is not None else ExportSettings()
    if steps.name != GameSteps.name and "min_new_games" in export.model_fields_set:
        raise ConfigError(f"daemons: export.settings.min_new_games counts games; a {steps.name} node starts a "
                          f"generation by lm.export.min_new_groups in its node config")
    return PipelineContext(settings, steps, steps.export_threshold(export), config_path=config_path)


def workload_steps(settings: Settings) -> WorkloadSteps:
    """The steps of a node's configured workload (`workload:` in its config)."""
    if settings.workload == "lm":
        from app.lm.workload.lm_steps import LMSteps  # transformers: imported only on lm nodes

        return LMSteps(settings)
    return GameSteps(settings)  # the config's Literal leaves only the game workload
