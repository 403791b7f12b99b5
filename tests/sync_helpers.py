"""What the sync tests share: solo mesh nodes on loopback serving routes, and a signed client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from aiohttp import web

from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.node import MeshNode


async def start_node(tmp: Path, node_id: str, routes: list[web.RouteDef], secret: bytes) -> MeshNode:
    node = MeshNode(node_id=node_id, host="127.0.0.1", port=0, data_dir=tmp / node_id, profile="fast", secret=secret)
    node.add_routes(routes)
    await node.start()
    return node


@asynccontextmanager
async def serving(tmp: Path, routes: Mapping[str, list[web.RouteDef]], secret: bytes) -> AsyncIterator[dict[str, MeshNode]]:
    """One solo node per name, each serving its routes; all stopped on exit."""
    nodes: dict[str, MeshNode] = {}
    try:
        for name, node_routes in routes.items():
            nodes[name] = await start_node(tmp, name, node_routes, secret)
        yield nodes
    finally:
        for node in nodes.values():
            await node.stop()


@asynccontextmanager
async def signed_client(secret: bytes) -> AsyncIterator[MeshClient]:
    client = MeshClient(secret, timeout=5.0)
    try:
        yield client
    finally:
        await client.close()
