"""`python -m app.coordination.p2p`: run one mesh node on its own (tests, local_cluster).

The orchestrator embeds MeshNode the same way; this entry point exists so the mesh can be
exercised with real processes before the rest of the node is assembled. CLI flags override
the config file.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from app.config import ConfigError, Settings, load_settings
from app.coordination.p2p.node import ClusterView, MeshNode
from app.coordination.p2p.work_rules import TRAINING_KIND, WorkSpec
from app.log import configure_logging


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m app.coordination.p2p", description=__doc__)
    p.add_argument("--config", help="YAML settings file")
    p.add_argument("--node-id")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--data-dir")
    p.add_argument("--peers", help="host:port or id@host:port, comma separated")
    p.add_argument("--voters", help="node ids, comma separated")
    p.add_argument("--priority", type=int)
    p.add_argument("--profile", choices=["lan", "wan", "fast"])
    p.add_argument("--demo-work", type=int, default=0, metavar="N",
                   help="leader schedules N demo items (+ N//4 training items); for tests and demos")
    p.add_argument("--demo-ttl", type=float, default=None, help="claim TTL of the demo items")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def demo_work_source(n: int, ttl: float | None = None):  # type: ignore[no-untyped-def]
    """N generic items and N//4 training items, all wanted until someone completes them."""

    def source(view: ClusterView) -> list[WorkSpec]:
        specs = [WorkSpec("demo", f"{i:04d}", {"i": i}, ttl=ttl) for i in range(n)]
        specs += [WorkSpec(TRAINING_KIND, f"gen{i:03d}", {"gen": i}, ttl=ttl) for i in range(n // 4)]
        return specs

    return source


async def run(args: argparse.Namespace) -> int:
    settings: Settings = load_settings(args.config)
    node = MeshNode(
        settings, node_id=args.node_id, host=args.host, port=args.port, data_dir=args.data_dir,
        peers=args.peers, voters=args.voters, priority=args.priority, profile=args.profile,
        work_source=demo_work_source(args.demo_work, args.demo_ttl) if args.demo_work else None,
    )
    configure_logging(node.node_id, args.log_level)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await node.start()
    print(f"READY {node.node_id} {node.addr}", flush=True)
    await stop.wait()
    await node.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return asyncio.run(run(args))
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
