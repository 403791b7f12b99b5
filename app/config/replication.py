"""How many nodes keep a copy of every game (app/coordination/sync/replication.py)."""

from pydantic import Field

from app.config.base import StrictModel


class ReplicationConfig(StrictModel):
    # Nodes that should hold each finished game, its origin included. A lone node keeps one
    # copy whatever this says; with fewer alive nodes than this, every alive node holds all.
    factor: int = Field(2, ge=1)
