"""Where a node lives: its id, data directory and ports."""

import socket
from pathlib import Path

from pydantic import Field

from app.config.base import StrictModel


DEFAULT_MESH_PORT = 8770


def default_node_id(mesh_port: int) -> str:
    """The host name; with another mesh port than the default, `<host>-<port>`: several nodes
    started with defaults on one host (each needs its own port) get distinct ids."""
    host = socket.gethostname()
    return host if mesh_port == DEFAULT_MESH_PORT else f"{host}-{mesh_port}"


class NodeConfig(StrictModel):
    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    mesh_port: int = DEFAULT_MESH_PORT
    node_id: str = Field(default_factory=lambda data: default_node_id(data.get("mesh_port", DEFAULT_MESH_PORT)))
    health_port: int = 8790
    role: str = "all"  # which daemons.yaml roles this node runs
    # registry, replay store and work queue in this database (postgresql+psycopg://...) rather
    # than SQLite files under data_dir; one database per node
    db_url: str | None = None
    game: str = "connect4"
    # once generations are decided, delete what no later step reads: decided runs' checkpoints
    # (but the best's and the head's runs), older datasets, superseded heads in the model store
    # (app/coordination/pipeline/retention.py); false keeps everything
    retention: bool = True
    keep_datasets: int = Field(2, ge=0, le=10_000)  # decided generations' datasets kept, newest first
