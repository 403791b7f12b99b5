"""DaemonManager with real runners, a real event router and a real health server on loopback."""

import asyncio
import random

import aiohttp
import pytest

from app.config import Settings
from app.coordination.daemons.manager import DaemonManager, DaemonState
from app.coordination.daemons.daemon_registry import build_registry
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.daemons.health_server import HealthServer

pytestmark = pytest.mark.timeout(30)


def manager_for(daemons: dict, runners: dict, role: str = "all", **file_level) -> DaemonManager:
    registry = build_registry({"daemons": daemons, **file_level}, runners, "test-daemons.yaml")
    return DaemonManager(registry.select(role), router=EventRouter(), settings=Settings(), rng=random.Random(7))


async def wait_until(condition, timeout: float = 10.0) -> bool:
    """Poll `condition` until true or `timeout`; generous bounds keep a loaded CI machine green."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition() and loop.time() < end:
        await asyncio.sleep(0.01)
    return condition()


async def steady(ctx):
    ctx.mark_healthy()
    await ctx.stopping.wait()


async def test_starts_in_dependency_order_and_stops_in_reverse():
    log: list[tuple[str, str]] = []

    def recorder(name):
        async def run(ctx):
            log.append(("start", name))
            await asyncio.sleep(0.05)  # initialisation a dependent must wait for
            log.append(("healthy", name))
            ctx.mark_healthy()
            await ctx.stopping.wait()
            log.append(("stopping", name))
            await asyncio.sleep(0.02)  # draining work; its dependencies must still be up
            log.append(("stop", name))

        return run

    deps = {"selfplay": ["db", "cache"], "train": ["db"], "cache": ["db"], "db": []}
    manager = manager_for(
        {name: {"depends_on": d} for name, d in deps.items()}, {n: (recorder(n), {}) for n in deps}
    )
    start = asyncio.create_task(manager.start())
    await asyncio.sleep(0)
    assert manager.readiness().reason == "starting"
    await start
    assert manager.readiness().ready
    assert all(manager.status(n).state is DaemonState.RUNNING for n in deps)
    # A daemon starts only after each dependency reported healthy, not merely launched.
    for name, ds in deps.items():
        for dep in ds:
            assert log.index(("healthy", dep)) < log.index(("start", name))
    starts = [n for kind, n in log if kind == "start"]
    assert starts == ["db", "cache", "selfplay", "train"]

    await manager.drain_and_stop(deadline_s=5)
    # Dependents finish draining before any of their dependencies is even asked to stop.
    for name, ds in deps.items():
        for dep in ds:
            assert log.index(("stop", name)) < log.index(("stopping", dep))
    assert log[-1] == ("stop", "db")
    assert all(manager.status(n).state is DaemonState.STOPPED for n in deps)
    assert manager.readiness().reason == "draining"


async def test_crashing_critical_daemon_backs_off_then_gives_up_and_readyz_turns_503():
    loop = asyncio.get_running_loop()
    starts: list[float] = []

    async def crasher(ctx):
        starts.append(loop.time())
        raise RuntimeError("boom")

    manager = manager_for(
        {
            "steady": {"critical": True},
            "crasher": {"critical": True, "start_timeout_s": 0.2,
                        "restart": {"base_s": 0.1, "cap_s": 5, "crash_loop_starts": 5, "crash_loop_window_s": 30}},
        },
        {"steady": (steady, {}), "crasher": (crasher, {})},
    )
    crash_events = []

    async def on_crash_loop(event):
        crash_events.append(event.payload)

    manager.router.subscribe(EventType.DAEMON_CRASH_LOOP, on_crash_loop)
    server = HealthServer(manager, manager.metrics, port=0)
    await server.start()
    try:
        await manager.start()
        async with aiohttp.ClientSession() as http:
            status, body = None, None
            for _ in range(300):
                async with http.get(f"{server.url}/readyz") as resp:
                    status, body = resp.status, await resp.json()
                if status == 503 and "gave up" in body["reason"]:
                    break
                await asyncio.sleep(0.05)
            assert status == 503 and "crasher" in body["reason"]
            async with http.get(f"{server.url}/daemons") as resp:
                daemons = {d["name"]: d for d in (await resp.json())["daemons"]}
            async with http.get(f"{server.url}/metrics") as resp:
                metrics_text = await resp.text()
            async with http.get(f"{server.url}/livez") as resp:
                assert resp.status == 200  # liveness ignores daemon health
        # Five starts, four restarts in between, each wait longer than the one before.
        assert len(starts) == 5
        status = manager.status("crasher")
        assert status.restarts == 4 and status.state is DaemonState.FAILED
        assert all(a < b for a, b in zip(status.delays, status.delays[1:]))
        gaps = [b - a for a, b in zip(starts, starts[1:])]
        assert all(gap >= delay for gap, delay in zip(gaps, status.delays))
        assert daemons["crasher"]["state"] == "failed"
        assert daemons["crasher"]["last_error"] == "RuntimeError: boom"
        assert daemons["steady"]["state"] == "running" and daemons["steady"]["healthy"]
        assert 'mesh_daemon_restarts_total{daemon="crasher",node="local"} 4.0' in metrics_text
        assert len(crash_events) == 1 and crash_events[0].daemon == "crasher" and crash_events[0].critical
    finally:
        await manager.drain_and_stop(deadline_s=5)
        await server.stop()


async def test_a_non_critical_daemon_giving_up_keeps_the_node_ready():
    async def crasher(ctx):
        raise ValueError("bad input")

    manager = manager_for(
        {"crasher": {"start_timeout_s": 0.1, "restart": {"base_s": 0.01, "crash_loop_starts": 3}}},
        {"crasher": (crasher, {})},
    )
    await manager.start()
    await wait_until(lambda: manager.status("crasher").state is DaemonState.FAILED)
    assert manager.status("crasher").state is DaemonState.FAILED
    assert manager.readiness().ready
    await manager.drain_and_stop(deadline_s=2)


async def test_missing_heartbeat_and_failing_health_check_restart_the_daemon():
    async def goes_quiet(ctx):
        ctx.mark_healthy()
        await ctx.stopping.wait()  # never beats again

    checks = {"n": 0}

    def health(ctx):
        checks["n"] += 1
        return checks["n"] % 3 != 0  # every third check fails

    manager = manager_for(
        {
            "quiet": {"health_interval_s": 0.05, "heartbeat_timeout_s": 0.15, "restart": {"base_s": 0.01}},
            "checked": {"health_interval_s": 0.05, "restart": {"base_s": 0.01}},
        },
        {"quiet": (goes_quiet, {}), "checked": (steady, {}, health)},
    )
    await manager.start()
    await wait_until(lambda: manager.status("quiet").restarts >= 2 and manager.status("checked").restarts >= 2)
    await manager.drain_and_stop(deadline_s=2)
    assert manager.status("quiet").restarts >= 2
    assert "no heartbeat" in manager.status("quiet").last_error
    assert manager.status("checked").restarts >= 2
    assert manager.status("checked").last_error == "health check failed: health check returned false"


async def test_backoff_starts_over_after_a_long_enough_healthy_run():
    async def flaky(ctx):
        ctx.mark_healthy()
        await asyncio.sleep(0.35)  # longer than reset_after_s
        raise RuntimeError("flake")

    async def fast_crasher(ctx):
        ctx.mark_healthy()
        raise RuntimeError("crash")

    restart = {"base_s": 0.02, "cap_s": 10, "reset_after_s": 0.3, "crash_loop_starts": 100}
    manager = manager_for(
        {"flaky": {"restart": restart}, "fast": {"restart": restart}},
        {"flaky": (flaky, {}), "fast": (fast_crasher, {})},
    )
    await manager.start()
    await wait_until(lambda: len(manager.status("flaky").delays) >= 4 and len(manager.status("fast").delays) >= 4)
    await manager.drain_and_stop(deadline_s=2)
    assert all(d <= 0.02 for d in manager.status("flaky").delays)  # always attempt 0
    assert manager.status("fast").delays[3] > 0.02 * 4  # attempt 3: >= 8 * base / 2


async def test_runner_returning_before_stop_counts_as_a_crash():
    async def quitter(ctx):
        ctx.mark_healthy()

    manager = manager_for({"quitter": {"restart": {"base_s": 0.01}}}, {"quitter": (quitter, {})})
    await manager.start()
    await wait_until(lambda: manager.status("quitter").restarts > 0)
    await manager.drain_and_stop(deadline_s=2)
    assert manager.status("quitter").last_error == "runner returned before it was asked to stop"


async def test_drain_cancels_a_daemon_that_ignores_stop_within_the_deadline():
    cancelled = asyncio.Event()

    async def stubborn(ctx):
        ctx.mark_healthy()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    manager = manager_for({"stubborn": {"stop_timeout_s": 60}, "fine": {}},
                          {"stubborn": (stubborn, {}), "fine": (steady, {})})
    await manager.start()
    # within a deadline far below the stubborn daemon's own 60 s stop timeout: cut off at 0.3 s
    await asyncio.wait_for(manager.drain_and_stop(deadline_s=0.3), 30)
    assert cancelled.is_set()
    assert manager.status("stubborn").state is DaemonState.STOPPED
    assert manager.status("fine").state is DaemonState.STOPPED


async def test_a_daemon_that_ends_while_the_node_drains_is_not_restarted():
    """Once the drain has begun nothing is restarted: a dependency that ends on its own (here:
    as soon as it sees the drain, while its dependent still takes its time to stop) stays down,
    with its error kept, and the drain finishes without a restart or a stop timeout."""
    draining = asyncio.Event()

    async def ends_on_drain(ctx):
        ctx.mark_healthy()
        await draining.wait()
        raise RuntimeError("gone with the drain")

    async def slow_to_stop(ctx):
        ctx.mark_healthy()
        await ctx.stopping.wait()
        await asyncio.sleep(0.2)

    restart = {"base_s": 0.01, "cap_s": 0.02}
    manager = manager_for({"base": {"restart": restart}, "top": {"depends_on": ["base"], "stop_timeout_s": 5}},
                          {"base": (ends_on_drain, {}), "top": (slow_to_stop, {})})
    await manager.start()
    manager.begin_drain()
    draining.set()
    assert await wait_until(lambda: manager.status("base").state is DaemonState.STOPPED)
    await asyncio.wait_for(manager.drain_and_stop(deadline_s=5), 5)
    base = manager.status("base")
    assert base.restarts == 0 and base.last_error == "RuntimeError: gone with the drain"
    assert manager.status("top").state is DaemonState.STOPPED
