"""Where a node lives: its id, data directory and ports."""

import socket
from pathlib import Path

from pydantic import Field

from app.config.base import StrictModel


class NodeConfig(StrictModel):
    node_id: str = Field(default_factory=socket.gethostname)
    data_dir: Path = Path("data")
    host: str = "127.0.0.1"
    mesh_port: int = 8770
    health_port: int = 8790
    role: str = "all"  # which daemons.yaml roles this node runs
    # registry, replay store and work queue in this database (postgresql+psycopg://...) rather
    # than SQLite files under data_dir; one database per node
    db_url: str | None = None
    game: str = "connect4"
