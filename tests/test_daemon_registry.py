"""daemons.yaml validation against the runner table: every mistake names the file and key."""

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from app.config import ConfigError
from app.coordination.daemons.daemon_registry import RunnerEntry, load_registry
from app.coordination.daemons.dlq_retry import INFRA_RUNNERS

REPO = Path(__file__).resolve().parents[1]


async def idle(ctx):
    await ctx.stopping.wait()


class TrainSettings(BaseModel):
    model_config = {"extra": "forbid"}
    batch: int = 8


RUNNERS = {
    "db": (idle, {"path": "x.sqlite"}),
    "selfplay": RunnerEntry(idle, {"games": 1}),
    "train": RunnerEntry(idle, TrainSettings),
}


def write(tmp_path, data) -> Path:
    path = tmp_path / "daemons.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_loads_order_roles_settings_and_restart_overrides(tmp_path):
    path = write(
        tmp_path,
        {
            "restart": {"base_s": 2, "crash_loop_starts": 3},
            "daemons": {
                "selfplay": {"depends_on": ["db"], "roles": ["all", "selfplay"], "settings": {"games": 5},
                             "restart": {"cap_s": 7}},
                "train": {"depends_on": ["db"], "roles": ["all", "train"], "critical": True},
                "db": {"roles": ["all", "selfplay", "train"]},
            },
        },
    )
    reg = load_registry(path, RUNNERS)
    assert list(reg.specs) == ["db", "selfplay", "train"]
    sp = reg.specs["selfplay"]
    assert sp.settings.games == 5  # typed: the runner's schema (a mapping of defaults becomes one)
    assert (sp.restart.base_s, sp.restart.cap_s, sp.restart.crash_loop_starts) == (2, 7, 3)
    assert reg.specs["db"].restart.cap_s == 300  # file policy, defaults elsewhere
    assert reg.specs["train"].settings == TrainSettings() and reg.specs["train"].critical
    assert [s.name for s in reg.select("all")] == ["db", "selfplay", "train"]
    assert [s.name for s in reg.select("selfplay")] == ["db", "selfplay"]
    assert reg.select("nobody") == []


@pytest.mark.parametrize(
    "data, needle",
    [
        ({"daemons": {"db": {"enabeld": True}}}, "daemons.db.enabeld"),
        ({"dameons": {}}, "dameons"),
        ({"daemons": {"gpu_miner": {}}}, "daemons.gpu_miner: unknown daemon"),
        ({"daemons": {"db": {"depends_on": ["cache"]}}}, "daemons.db.depends_on: unknown daemon 'cache'"),
        ({"daemons": {"db": {"settings": {"pth": "y"}}}}, "daemons.db.settings: pth: Extra inputs are not permitted"),
        ({"daemons": {"train": {"settings": {"batch": "big"}}}}, "daemons.train.settings: batch"),
        ({"daemons": {"db": {"restart": {"cap_s": -1}}}}, "daemons.db.restart.cap_s"),
        (
            {"daemons": {"db": {"depends_on": ["train"]}, "train": {"depends_on": ["selfplay"]},
                         "selfplay": {"depends_on": ["db"]}}},
            "dependency cycle: db -> train -> selfplay -> db",
        ),
        ("daemons: [1, 2", "not valid YAML"),
        ("- just a list", "top level must be a mapping"),
    ],
)
def test_mistakes_are_config_errors_naming_file_and_key(tmp_path, data, needle):
    path = write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_registry(path, RUNNERS)
    assert str(path) in str(info.value)
    assert needle in str(info.value)


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_registry(tmp_path / "nope.yaml", RUNNERS)


def test_selected_daemon_with_an_unselected_dependency_is_an_error(tmp_path):
    path = write(
        tmp_path,
        {"daemons": {"db": {"enabled": False}, "selfplay": {"depends_on": ["db"], "roles": ["all"]},
                     "train": {"roles": ["train"], "depends_on": ["selfplay"]}}},
    )
    reg = load_registry(path, RUNNERS)
    with pytest.raises(ConfigError, match=r"daemons\.selfplay\.depends_on: 'db' is disabled"):
        reg.select("all")
    with pytest.raises(ConfigError, match=r"daemons\.train\.depends_on: 'selfplay' does not run on role 'train'"):
        reg.select("train")


def test_the_repository_daemons_yaml_loads_with_every_runner(tmp_path):
    from app.config import load_settings
    from app.coordination.pipeline.runners import pipeline_runners
    from app.workloads import pipeline_context

    pipe = pipeline_context(load_settings(None, node={"data_dir": str(tmp_path)}))
    reg = load_registry(REPO / "daemons.yaml", {**INFRA_RUNNERS, **pipeline_runners(pipe)})
    names = [s.name for s in reg.select("all")]
    assert {"dlq_retry", "selfplay", "export", "train", "gauntlet", "promote", "distribution"} <= set(names)
    assert names.index("export") < names.index("train") < names.index("gauntlet") < names.index("promote")
    with pytest.raises(ConfigError, match="daemons.selfplay"):
        load_registry(REPO / "daemons.yaml", INFRA_RUNNERS)  # a daemon the code has no runner for
