#!/usr/bin/env python3
"""How fast things stop: the timing aims the tests used to assert, measured here instead (tests
check what happens, never how long it took).

    python scripts/bench_stop.py [--rounds 3]

Prints ONE JSON object:
- `launcher_fail_fast_s`: from a failing rank's exit to `launch()` returning, while the other
  rank ignores SIGTERM (torchrun alone would wait 30 s); aim: the grace period (1 s) + 4 s;
- `drain_cut_off_s`: `DaemonManager.drain_and_stop(deadline_s=0.3)` with a daemon that ignores
  stop and has a 60 s stop timeout; aim: < 1.5 s;
- `handler_cut_off_s`: `EventRouter.publish` with a handler that hangs, timeout 0.2 s; aim: < 1.5 s.
Each is the median and max over `--rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config import Settings  # noqa: E402
from app.coordination.daemons.event_router import EventRouter  # noqa: E402
from app.coordination.daemons.events import EventType  # noqa: E402
from app.coordination.daemons.manager import DaemonManager  # noqa: E402
from app.coordination.daemons.daemon_registry import build_registry  # noqa: E402
from app.shared.launcher import LaunchError, LaunchSpec, launch  # noqa: E402

FAILING_WORKER = """
import signal, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
if dist.get_rank() == 0:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
dist.barrier()
while dist.get_rank() == 0:
    time.sleep(0.2)
raise RuntimeError("rank one gives up")
"""


def launcher_fail_fast() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "worker.py"
        script.write_text(FAILING_WORKER)
        spec = LaunchSpec(target=[str(script)], nproc=2, log_dir=Path(tmp) / "logs", grace_s=1.0,
                          status_every_s=0, timeout_s=120)
        try:
            launch(spec, out=io.StringIO())
        except LaunchError:
            returned = time.time()
        else:
            raise RuntimeError("the failing run did not fail")
        exit_at = json.loads((Path(tmp) / "logs" / "rank_1.exit.json").read_text())["at"]
        return returned - exit_at


async def drain_cut_off() -> float:
    async def stubborn(ctx):
        ctx.mark_healthy()
        await asyncio.sleep(3600)

    registry = build_registry({"daemons": {"stubborn": {"stop_timeout_s": 60}}}, {"stubborn": (stubborn, {})}, "bench")
    manager = DaemonManager(registry.select("all"), router=EventRouter(), settings=Settings())
    await manager.start()
    began = time.monotonic()
    await manager.drain_and_stop(deadline_s=0.3)
    return time.monotonic() - began


async def handler_cut_off() -> float:
    router = EventRouter(handler_timeout_s=0.2)

    async def hangs(event):
        await asyncio.sleep(3600)

    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, hangs, name="hangs")
    began = time.monotonic()
    await router.publish(EventType.NEW_ITEMS_AVAILABLE, {"count": 1, "total": 1})
    return time.monotonic() - began


def summary(values: list[float], aim: float) -> dict:
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3), "aim": aim,
            "met": max(values) < aim}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    fail_fast = [launcher_fail_fast() for _ in range(args.rounds)]
    drains = [asyncio.run(drain_cut_off()) for _ in range(args.rounds)]
    handlers = [asyncio.run(handler_cut_off()) for _ in range(args.rounds)]
    print(json.dumps({
        "load_average": round(os.getloadavg()[0], 2),
        "launcher_fail_fast_s": summary(fail_fast, 1.0 + 4.0),
        "drain_cut_off_s": summary(drains, 1.5),
        "handler_cut_off_s": summary(handlers, 1.5),
    }))


if __name__ == "__main__":
    main()
