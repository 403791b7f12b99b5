"""Shared base of every config section."""

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration problem; the message names the file and the key."""


class StrictModel(BaseModel):
    """Unknown keys are errors; instances are immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)
