"""The operator CLI: one command for a running cluster and a node's registry.

    python -m app.cli status   [--node HOST:8770] [--json]     every node: role, term, quorum, model, games
    python -m app.cli progress [--node HOST:8770] [--json]     decided generations, best, rolled back
    python -m app.cli rollback [--generation G] [--reason R]   withdraw the cluster's best (voter quorum)
    python -m app.cli promote  SHA [--reason R]                promote a model in this node's registry
    python -m app.cli drain    --node HOST:8770                hand leadership away, then drain that node
    python -m app.cli transfer --to NODE_ID [--node HOST:8770] hand leadership to another live voter
    python -m app.cli registry ...                             registry commands (evaluate, list, ...)

Mesh commands are signed with the cluster secret (MESH_SECRET or MESH_SECRET_FILE, or --config's
mesh.secret / mesh.secret_file), or with an operator key from the cluster tool (--config's
mesh.node_keys), and sent to any node: a follower's answer names the leader and
the command is re-sent there. Exit status: 0 done, 1 refused or unreachable, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp

from app.cli.mesh_commands import MeshAdmin, format_status
from app.config import ConfigError, load_settings
from app.coordination.p2p.auth import load_identity
from app.coordination.p2p.identity import Identity
from app.coordination.p2p.client import MeshClient

MESH_COMMANDS = ("status", "progress", "rollback", "drain", "transfer")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="node config YAML (secret, data dir)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    sub = p.add_subparsers(dest="command", required=True)
    for name, text in (("status", "every node's role, term, quorum, model and games"),
                       ("progress", "the cluster's decided generations")):
        s = sub.add_parser(name, help=text)
        s.add_argument("--node", default="127.0.0.1:8770", help="any node's mesh address (host:port)")
    r = sub.add_parser("rollback", help="withdraw the cluster's best model (a quorum decision)")
    r.add_argument("--node", default="127.0.0.1:8770")
    r.add_argument("--generation", type=int, default=None, help="the promoted generation to withdraw (default: the best)")
    r.add_argument("--reason", default="operator rollback")
    d = sub.add_parser("drain", help="stop a node gracefully (leadership handed over first)")
    d.add_argument("--node", required=True, help="the node to drain (host:port of its mesh API)")
    t = sub.add_parser("transfer", help="hand leadership to another live voter")
    t.add_argument("--to", required=True, help="node id of the new leader")
    t.add_argument("--node", default="127.0.0.1:8770")
    pr = sub.add_parser("promote", help="promote a candidate in this node's registry (file sha256 checked)")
    pr.add_argument("sha256")
    pr.add_argument("--reason", default="manual promotion")
    pr.add_argument("--registry", default=None, help="registry file or database URL (default: the node's)")
    sub.add_parser("registry", help="registry commands: evaluate, promote, rollback, progress, list", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "registry" in argv or "promote" in argv:
        from app.cli import registry_commands  # imports torch: only for the commands that need it
    if "registry" in argv:  # everything after it belongs to the registry commands
        i = argv.index("registry")
        head, rest = argv[:i], argv[i + 1:]
        config = ["--config", head[head.index("--config") + 1]] if "--config" in head else []
        return registry_commands.main(config + rest, prog="python -m app.cli registry")
    as_json = "--json" in argv  # accepted before or after the subcommand
    args = build_parser().parse_args([a for a in argv if a != "--json"])
    args.json = as_json
    if args.command == "promote":
        extra = (["--registry", args.registry] if args.registry else []) + \
                (["--config", str(args.config)] if args.config else [])
        return registry_commands.main(extra + ["promote", args.sha256, "--reason", args.reason])
    try:
        mesh = load_settings(args.config).mesh
        secret = load_identity(mesh)  # mesh.node_keys: the operator's own key (`tls init --nodes ...,operator`)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        ok, answer = asyncio.run(_run(args, secret))
    except (OSError, aiohttp.ClientError, asyncio.TimeoutError) as exc:
        print(f"error: cannot reach {args.node}: {exc!r}", file=sys.stderr)
        return 1
    _print(args, answer)
    return 0 if ok else 1


async def _run(args: argparse.Namespace, secret: Identity) -> tuple[bool, Any]:
    admin = MeshAdmin(MeshClient(secret, 10.0, node_id=getattr(secret, "node_id", "operator")))
    try:
        if args.command == "status":
            return True, await admin.cluster_status(args.node)
        if args.command == "progress":
            return True, await admin.progress(args.node)
        if args.command == "rollback":
            return await admin.rollback(args.node, args.generation, args.reason)
        if args.command == "transfer":
            return await admin.transfer(args.node, args.to)
        return await admin.drain(args.node)
    finally:
        await admin.close()


def _print(args: argparse.Namespace, answer: Any) -> None:
    if args.json or args.command not in ("status", "progress"):
        print(json.dumps(answer, indent=None if args.command != "progress" else 1))
    elif args.command == "status":
        print(format_status(answer))
    else:
        for g in answer.get("generations", []):
            mark = " (rolled back)" if g["generation"] in answer.get("rolled_back", []) else ""
            print(f"gen {g['generation']:>3}  {'promoted' if g['promoted'] else 'rejected':<8}  "
                  f"{g['sha256'][:12]}  by {g['trained_by']}{mark}  {g.get('reason', '')[:60]}")
        print(f"best: generation {answer.get('best_generation', 0)} ({(answer.get('current_best') or 'uniform')[:12]})")


if __name__ == "__main__":
    sys.exit(main())
