"""The seam between the pipeline daemons and a workload (app/coordination/pipeline/steps.py):
both workloads fill it, each mounts only its own routes, the optional capabilities are asked for
and not stubbed, and the export threshold is read once, from the workload's own setting."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from app.config import ConfigError, Settings
from app.coordination.daemons.events import EventType, validate_payload
from app.coordination.pipeline.runner_settings import ExportSettings
from app.coordination.pipeline.steps import PullsBeforeExport, ReportsStatus, WorkloadSteps
from app.workloads import pipeline_context

pytestmark = pytest.mark.timeout(60)


def settings(tmp_path: Path, workload: str) -> Settings:
    return Settings.model_validate({"workload": workload, "node": {"data_dir": str(tmp_path / workload)}})


def seam_members() -> set[str]:
    return {name for name in dir(WorkloadSteps) if not name.startswith("_")} | set(WorkloadSteps.__annotations__)


@pytest.mark.parametrize("workload", ["connect4", "lm"])
def test_each_workload_fills_the_seam_and_mounts_only_its_own_routes(tmp_path: Path, workload: str) -> None:
    pipe = pipeline_context(settings(tmp_path, workload))
    steps = pipe.steps
    missing = {name for name in seam_members() if not hasattr(steps, name)}
    assert missing == set()
    for name in seam_members():
        declared = getattr(WorkloadSteps, name, None)
        if inspect.iscoroutinefunction(declared):
            assert inspect.iscoroutinefunction(getattr(steps, name)), name
    paths = {route.path for route in steps.routes()}
    games = {p for p in paths if p.startswith(("/games", "/replica/games", "/models"))}
    lm = {p for p in paths if p.startswith(("/lm_models", "/lm_datasets", "/replica/rollouts"))}
    if workload == "connect4":
        assert games and not lm
        assert isinstance(steps, PullsBeforeExport) and not isinstance(steps, ReportsStatus)
    else:
        assert lm and not games
        assert isinstance(steps, ReportsStatus) and not isinstance(steps, PullsBeforeExport)
    steps.close()


def test_the_export_threshold_is_the_workloads_own_setting_read_once(tmp_path: Path) -> None:
    export = ExportSettings(min_new_games=77)
    assert pipeline_context(settings(tmp_path, "connect4"), export=export).export_threshold == 77
    assert pipeline_context(settings(tmp_path, "connect4")).export_threshold == ExportSettings().min_new_games
    lm = settings(tmp_path, "lm")
    assert pipeline_context(lm).export_threshold == lm.lm.export.min_new_groups
    assert pipeline_context(lm, export=ExportSettings(poll_s=2)).export_threshold == lm.lm.export.min_new_groups
    with pytest.raises(ConfigError, match="min_new_games counts games.*lm.export.min_new_groups"):
        pipeline_context(lm, export=export)  # a setting an lm node would not act on
    with pytest.raises(AttributeError):
        pipeline_context(lm).export_threshold = 3  # type: ignore[misc]  # fixed for the node's life


def test_the_new_items_event_keeps_its_old_name_for_one_release() -> None:
    assert EventType.NEW_GAMES_AVAILABLE is EventType.NEW_ITEMS_AVAILABLE
    assert EventType("new_games_available") is EventType.NEW_ITEMS_AVAILABLE  # a stored letter of the last release
    assert EventType.NEW_ITEMS_AVAILABLE.value == "new_items_available"
    assert validate_payload("new_games_available", {"count": 2, "total": 9}).model_dump() == {"count": 2, "total": 9}
