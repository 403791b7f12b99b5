"""Node configuration: one pydantic tree, loaded from YAML, validated strictly.

Each section lives in its own module and belongs to the layer that reads it; this package
sits at the bottom of the import graph so every layer can import it. An unknown key anywhere
is an error naming the file and the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, ValidationError, model_validator

from app.config.base import ConfigError, StrictModel
from app.config.configs import ConfigEntry, SchedulerConfig, check_configs, lineage_settings
from app.config.lm import LMConfig, Workload, workload_problems
from app.config.mesh import MeshConfig
from app.config.pipeline import (
    ExportConfig,
    FeedbackConfig,
    GauntletConfig,
    ModelConfig,
    PromotionConfig,
    SearchConfig,
    SelfplayConfig,
    TrainConfig,
)
from app.config.node import NodeConfig
from app.config.replication import ReplicationConfig


class Settings(StrictModel):
    workload: Workload = "connect4"  # which loop this node runs (app/config/lm.py: the rule for mixed settings)
    node: NodeConfig = NodeConfig()
    mesh: MeshConfig = MeshConfig()
    model: ModelConfig = ModelConfig()
    search: SearchConfig = SearchConfig()
    selfplay: SelfplayConfig = SelfplayConfig()
    export: ExportConfig = ExportConfig()
    train: TrainConfig = TrainConfig()
    gauntlet: GauntletConfig = GauntletConfig()
    promotion: PromotionConfig = PromotionConfig()
    feedback: FeedbackConfig = FeedbackConfig()  # the quality and plateau loops (connect4 workload)
    replication: ReplicationConfig = ReplicationConfig()
    lm: LMConfig = LMConfig()
    # several configs on one cluster (games, or an lm config), each its own lineage (app/config/configs.py); empty:
    # one lineage of node.game, as before
    configs: list[ConfigEntry] = Field(default=[], max_length=16)
    scheduler: SchedulerConfig = SchedulerConfig()

    @model_validator(mode="after")
    def _configs_fit(self) -> Settings:
        if not self.configs:
            return self
        check_configs(self.configs)
        if self.workload == "lm":
            raise ValueError("configs: an lm node runs one lineage; list an lm config (workload: lm) "
                             "in the configs of a game node instead")
        if self.node.db_url and len(self.configs) > 1:
            raise ValueError("configs: several configs keep their lineages in files under the data dir; "
                             "node.db_url would put them in one database")
        lineage_settings(self)  # every config's overrides valid now, not when its lineage starts
        return self

    @model_validator(mode="after")
    def _plateau_bounds(self) -> "Settings":
        plateau = self.feedback.plateau
        if plateau.enabled and plateau.max_fraction < self.search.dirichlet_fraction:
            raise ValueError(f"feedback.plateau.max_fraction ({plateau.max_fraction}) is below "
                             f"search.dirichlet_fraction ({self.search.dirichlet_fraction}): the loop could never raise it")
        return self


def read_yaml_mapping(path: Path, what: str) -> dict:
    """A YAML file whose top level is a mapping (a node config, daemons.yaml); every problem is
    a ConfigError naming the file."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"{path}: {what} file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    return data


def load_settings(path: str | Path | None = None, **overrides: object) -> Settings:
    """Settings from a YAML file (or defaults when `path` is None), then top-level overrides."""
    data = read_yaml_mapping(Path(path), "config") if path is not None else {}
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path or '<defaults>'}: {format_validation_error(exc)}") from None
    _check_one_workload(settings, data, path)
    return settings


def _check_one_workload(settings: Settings, data: dict, path: Path | None) -> None:
    """A file that sets keys of the other workload is refused, naming them. Checked on what the
    file gives (not on the validated model), so a model_dump -> model_validate round trip of a
    node's settings, which spells out every section, never trips it."""
    section = lambda name: set(data.get(name) or {}) if isinstance(data.get(name), dict) else set()  # noqa: E731
    problems = workload_problems(settings.workload, {"": set(data), "node": section("node"), "train": section("train")})
    if problems:
        raise ConfigError(f"{path or '<defaults>'}: " + "; ".join(f"{key}: {why}" for key, why in problems))


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, 'dotted.key: message', for humans."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" if err["loc"] else err["msg"]
        for err in exc.errors()
    )


__all__ = [
    "ConfigEntry",
    "ConfigError",
    "ExportConfig",
    "GauntletConfig",
    "LMConfig",
    "MeshConfig",
    "ModelConfig",
    "NodeConfig",
    "PromotionConfig",
    "ReplicationConfig",
    "SearchConfig",
    "SchedulerConfig",
    "SelfplayConfig",
    "Settings",
    "StrictModel",
    "TrainConfig",
    "format_validation_error",
    "load_settings",
]
