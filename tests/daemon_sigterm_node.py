"""Test-only node process: a DaemonManager plus health server that drains on SIGTERM.

Usage: python tests/daemon_sigterm_node.py DEADLINE_S DRAIN_S
Prints {"port": N} once ready to be probed, and {"stopped": true, "worker_drained": ...} after
the shutdown.
It has a well-behaved daemon that needs DRAIN_S seconds to release its work after stop is
requested, and a stubborn one that ignores stop and must be cancelled at the deadline.
"""

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings  # noqa: E402
from app.coordination.daemons.manager import DaemonManager  # noqa: E402
from app.coordination.daemons.daemon_registry import build_registry  # noqa: E402
from app.coordination.daemons.event_router import EventRouter  # noqa: E402
from app.coordination.daemons.health_server import HealthServer  # noqa: E402
from app.log import configure_logging  # noqa: E402


async def main(deadline_s: float, drain_s: float) -> None:
    configure_logging(node_id="sigterm-test", json=True)  # logs to stderr, stdout stays ours
    drained: list[bool] = []

    async def store(ctx):
        ctx.mark_healthy()
        await ctx.stopping.wait()

    async def worker(ctx):
        ctx.mark_healthy()
        await ctx.stopping.wait()
        await asyncio.sleep(drain_s)  # releasing in-flight work
        drained.append(True)

    async def stubborn(ctx):
        ctx.mark_healthy()
        await asyncio.sleep(3600)

    registry = build_registry(
        {
            "daemons": {
                "store": {"critical": True},
                "worker": {"depends_on": ["store"], "critical": True, "stop_timeout_s": 60},
                "stubborn": {"stop_timeout_s": 60},
            }
        },
        {"store": (store, {}), "worker": (worker, {}), "stubborn": (stubborn, {})},
    )
    router = EventRouter()
    manager = DaemonManager(registry.select("all"), router=router, settings=Settings())
    server = HealthServer(manager, router.metrics, port=0)
    port = await server.start()
    manager.install_signal_handlers(deadline_s=deadline_s)
    await manager.start()
    print(json.dumps({"port": port}), flush=True)
    await manager.wait_stopped()
    await server.stop()
    print(json.dumps({"stopped": True, "worker_drained": bool(drained)}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), float(sys.argv[2])))
