"""Node configuration: one pydantic tree, loaded from YAML, validated strictly.

Each section lives in its own module and belongs to the layer that reads it; this package
sits at the bottom of the import graph so every layer can import it. An unknown key anywhere
is an error naming the file and the key, so a typo never silently falls back to a default.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from app.config.base import ConfigError, StrictModel
from app.config.mesh import MeshConfig
from app.config.pipeline import (
    ExportConfig,
    GauntletConfig,
    ModelConfig,
    PromotionConfig,
    SearchConfig,
    SelfplayConfig,
    TrainConfig,
)
from app.config.node import NodeConfig


class Settings(StrictModel):
    node: NodeConfig = NodeConfig()
    mesh: MeshConfig = MeshConfig()
    model: ModelConfig = ModelConfig()
    search: SearchConfig = SearchConfig()
    selfplay: SelfplayConfig = SelfplayConfig()
    export: ExportConfig = ExportConfig()
    train: TrainConfig = TrainConfig()
    gauntlet: GauntletConfig = GauntletConfig()
    promotion: PromotionConfig = PromotionConfig()


def load_settings(path: str | Path | None = None, **overrides: object) -> Settings:
    """Settings from a YAML file (or defaults when `path` is None), then top-level overrides."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: the top level must be a mapping")
    data.update({k: v for k, v in overrides.items() if v is not None})
    try:
        return Settings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path or '<defaults>'}: {format_validation_error(exc)}") from None


def format_validation_error(exc: ValidationError) -> str:
    """One line per problem, 'dotted.key: message', for humans."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )


__all__ = [
    "ConfigError",
    "ExportConfig",
    "GauntletConfig",
    "MeshConfig",
    "ModelConfig",
    "NodeConfig",
    "PromotionConfig",
    "SearchConfig",
    "SelfplayConfig",
    "Settings",
    "StrictModel",
    "TrainConfig",
    "format_validation_error",
    "load_settings",
]
