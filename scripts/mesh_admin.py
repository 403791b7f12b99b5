#!/usr/bin/env python
"""Operator actions on a running mesh, signed with the cluster secret (env MESH_SECRET or
MESH_SECRET_FILE, or --config's mesh.secret / mesh.secret_file).

    python scripts/mesh_admin.py transfer --to n2 [--node 127.0.0.1:8770]

`transfer` hands leadership to another live voter (app/coordination/p2p/transfer.py); sent to
a follower, it is forwarded once to the leader that follower names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import ConfigError, load_settings  # noqa: E402
from app.coordination.p2p.auth import load_secret  # noqa: E402
from app.coordination.p2p.client import MeshClient  # noqa: E402


async def transfer(client: MeshClient, node: str, target: str) -> tuple[int, object]:
    try:
        status, answer = await client.request("POST", node, "/admin/transfer", {"target": target}, timeout=10.0)
        if status == 503 and isinstance(answer, dict) and answer.get("leader_addr"):
            status, answer = await client.request("POST", answer["leader_addr"], "/admin/transfer",
                                                  {"target": target}, timeout=10.0)
        return status, answer
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="YAML settings (for mesh.secret / mesh.secret_file)")
    sub = p.add_subparsers(dest="action", required=True)
    t = sub.add_parser("transfer", help="hand leadership to another live voter")
    t.add_argument("--to", required=True, help="node id of the new leader")
    t.add_argument("--node", default="127.0.0.1:8770", help="any node of the mesh (host:port)")
    args = p.parse_args(argv)
    try:
        mesh = load_settings(args.config).mesh
        client = MeshClient(load_secret(mesh.secret, mesh.secret_file), 10.0)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        status, answer = asyncio.run(transfer(client, args.node, args.to))
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        print(f"error: cannot reach {args.node}: {exc!r}", file=sys.stderr)
        return 1
    print(json.dumps(answer) if not isinstance(answer, str) else answer)
    return 0 if status == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
