"""The operator CLI: one command for a running cluster and a node's registry.

    python -m app.cli status   [--node HOST:8770] [--json]     every node: role, term, quorum, model, games
    python -m app.cli progress [--node HOST:8770] [--json]     decided generations, best, rolled back
    python -m app.cli progress --config NAME                   the same for one config of several (`configs:`)
    python -m app.cli rollback [--generation G] [--reason R]   withdraw the cluster's best (voter quorum)
    python -m app.cli promote  SHA [--reason R]                promote a model in this node's registry
    python -m app.cli drain    --node HOST:8770                hand leadership away, then drain that node
    python -m app.cli transfer --to NODE_ID [--node HOST:8770] hand leadership to another live voter
    python -m app.cli registry ...                             registry commands (evaluate, list, ...)
    python -m app.cli snapshot save FILE | restore FILE --data-dir D | status FILE
                                                               a node's state in one archive, and back

Reads (status, progress) are public: no secret. The commands that change the cluster (rollback,
drain, transfer) are signed: with an operator key from the cluster tool (--config's
mesh.node_keys), else the cluster secret: MESH_SECRET or MESH_SECRET_FILE, --config's
mesh.secret / mesh.secret_file, else the node's own <data_dir>/mesh_secret (./data, or
--data-dir / the config's node.data_dir: run it beside the node). They may be sent to any node:
a follower's answer names the leader and the command is re-sent there. --node takes host:port,
http://host:port or https://host:port (the mesh port, 8770 by default). Every error is one
line on stderr. Exit status: 0 done, 1 refused or unreachable, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.cli.mesh_commands import (
    MeshAdmin, NodeAddress, SECRET_HINT, config_progress, describe_error, format_progress, format_status, refusal_line,
)
from app.config import ConfigError, Settings, load_settings

if TYPE_CHECKING:
    from app.coordination.p2p.identity import Identity

READS = ("status", "progress")
SIGNED = ("rollback", "drain", "transfer")
TIMEOUT_S = 10.0


def node_address(text: str) -> NodeAddress:
    try:
        return NodeAddress.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m app.cli", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, help="node config YAML (secret, data dir, TLS)")
    p.add_argument("--data-dir", type=Path, help="the node's data dir, whose mesh_secret signs commands (default ./data)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    node_help = "any node's mesh address: host:port, http://host:port or https://host:port (default 127.0.0.1:8770)"
    # the connection flags go before or after the subcommand (as etcdctl and consul take them): the
    # top level's default is None, the subcommands' is to leave the top level's value alone
    p.add_argument("--node", type=node_address, default=None, help=node_help)
    p.add_argument("--timeout", type=float, default=None, help=f"seconds to wait for a node's answer (default {TIMEOUT_S})")
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--node", type=node_address, default=argparse.SUPPRESS, help=node_help)
    connection.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds to wait for an answer")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("status", help="every node's role, term, quorum, readiness, model and games", parents=[connection])
    pg = sub.add_parser("progress", help="the cluster's decided generations: Elo, solved-position accuracy",
                        parents=[connection])
    pg.add_argument("--config", dest="config_name", metavar="NAME", default=None,
                    help="one config of a node that runs several (its `configs:`): that config's generations")
    r = sub.add_parser("rollback", help="withdraw the cluster's best model (a quorum decision)", parents=[connection])
    r.add_argument("--generation", type=int, default=None, help="the promoted generation to withdraw (default: the best)")
    r.add_argument("--reason", default="operator rollback")
    sub.add_parser("drain", help="stop a node gracefully (leadership handed over first); --node is required",
                   parents=[connection])
    t = sub.add_parser("transfer", help="hand leadership to another live voter", parents=[connection])
    t.add_argument("--to", required=True, help="node id of the new leader")
    pr = sub.add_parser("promote", help="promote a candidate in this node's registry (file sha256 checked)")
    pr.add_argument("sha256")
    pr.add_argument("--reason", default="manual promotion")
    pr.add_argument("--registry", default=None, help="registry file or database URL (default: the node's)")
    sub.add_parser("registry", help="registry commands: evaluate, promote, rollback, progress, list", add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = _command(argv)
    if command == "snapshot":
        from app.cli import snapshot_commands
        i = argv.index("snapshot")
        return snapshot_commands.main(_hoist(argv[:i], argv[i + 1:]))
    if "registry" in argv or "promote" in argv:
        from app.cli import registry_commands
    if "registry" in argv:  # everything after it belongs to the registry commands
        i = argv.index("registry")
        head, rest = argv[:i], argv[i + 1:]
        config = ["--config", head[head.index("--config") + 1]] if "--config" in head else []
        return registry_commands.main(config + rest, prog="python -m app.cli registry")
    as_json = "--json" in argv  # accepted before or after the subcommand
    parser = build_parser()
    args = parser.parse_args([a for a in argv if a != "--json"])
    args.json = as_json
    if args.command == "drain" and args.node is None:
        parser.error("drain needs --node: the node to drain")
    args.node = args.node or NodeAddress("http", "127.0.0.1:8770")
    args.timeout = TIMEOUT_S if args.timeout is None else args.timeout
    if args.command == "promote":
        extra = (["--registry", args.registry] if args.registry else []) + \
                (["--config", str(args.config)] if args.config else [])
        return registry_commands.main(extra + ["promote", args.sha256, "--reason", args.reason])
    try:
        settings = load_settings(args.config)
        admin = _admin(args, settings)
    except (ConfigError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        status, answer = asyncio.run(_run(args, admin))
    except Exception as exc:  # noqa: BLE001 - every failure to talk to a node is one line, never a repr
        print(f"error: {describe_error(exc, args.node, args.timeout)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(answer, indent=1 if args.command == "progress" else None))
    elif status == 404 and args.command == "progress":  # --config NAME the node does not run
        print(f"error: {answer['error']}", file=sys.stderr)
    elif status != 200:
        print(f"error: {refusal_line(args.node, status, answer)}", file=sys.stderr)
    else:
        print(_text(args, answer))
    return 0 if status == 200 else 1


def _command(argv: list[str]) -> str | None:
    """The subcommand: the first word that is neither a flag nor a flag's value."""
    takes_value = {"--config", "--data-dir", "--timeout", "--node", "--db-url"}
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _hoist(head: list[str], rest: list[str]) -> list[str]:
    """Flags typed before the subcommand (`--config C snapshot save F`) handed to its action,
    after the action's name, where its parser reads them."""
    words = head + rest
    action = _command(rest)
    if action is None:
        return words
    i = next(j for j, w in enumerate(words) if w == action and (j >= len(head)))
    return [action, *words[:i], *words[i + 1:]]


def _admin(args: argparse.Namespace, settings: Settings) -> MeshAdmin:
    """Reads need no secret; the signed commands load a key (ConfigError naming where it looked)."""
    from app.coordination.p2p.client import MeshClient
    from app.coordination.p2p.tls import client_context

    ssl_context = None
    if args.node.scheme == "https":  # the cluster's CA and this operator's certificate, else the system's trust
        tls = settings.mesh.tls
        ssl_context = client_context(tls) if tls is not None else ssl.create_default_context()
    client = None
    if args.command in SIGNED:
        identity = _identity(settings, args.data_dir)
        client = MeshClient(identity, args.timeout, node_id=getattr(identity, "node_id", "operator"),
                            ssl_context=ssl_context)
    return MeshAdmin(args.node, client, ssl_context, args.timeout)


def _identity(settings: Settings, data_dir: Path | None) -> Identity:
    """The operator's own key (mesh.node_keys), the environment's or the config's secret, else
    the node's own secret file beside its data."""
    from app.coordination.p2p.auth import load_identity, load_secret

    try:
        return load_identity(settings.mesh)
    except ConfigError:
        path = (data_dir or settings.node.data_dir) / "mesh_secret"
        if not path.is_file():
            raise ConfigError(f"no mesh secret for a signed command (looked in the environment, the config and "
                              f"{path}): {SECRET_HINT}") from None
        return load_identity(settings.mesh, secret=load_secret(config_secret_file=path))


async def _run(args: argparse.Namespace, admin: MeshAdmin) -> tuple[int, Any]:
    try:
        if args.command == "status":
            return 200, await admin.cluster_status()
        if args.command == "progress":
            return config_progress(await admin.progress(), args.config_name)
        if args.command == "rollback":
            return await admin.rollback(args.generation, args.reason)
        if args.command == "transfer":
            return await admin.transfer(args.to)
        return await admin.drain()
    finally:
        await admin.close()


def _text(args: argparse.Namespace, answer: Any) -> str:
    if args.command == "status":
        return format_status(answer)
    if args.command == "progress":
        return format_progress(answer)
    if args.command == "rollback":
        return f"rolled back: {json.dumps(answer)}"
    if args.command == "transfer":
        return f"leadership handed to {args.to}: {json.dumps(answer)}"
    return f"draining {args.node}: {json.dumps(answer)}"


if __name__ == "__main__":
    sys.exit(main())
