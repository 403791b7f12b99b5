"""Runs the selected daemons: start in dependency order, watch health, restart with backoff,
give up on crash loops, stop in reverse order, drain on SIGTERM.

The decisions (backoff delay, crash loop, readiness) are pure functions in backoff.py and
`decide_readiness` below; this module only supervises tasks and acts on their answers.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import random
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.coordination.daemons.backoff import is_crash_loop, restart_delay, should_reset_backoff
from app.coordination.daemons.daemon_registry import DaemonContext, DaemonSpec
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.daemons.metrics import Metrics
from app.log import get_logger

log = get_logger(__name__)


class DaemonState(str, enum.Enum):
    PENDING = "pending"  # not launched yet (waiting for dependencies)
    RUNNING = "running"
    BACKOFF = "backoff"  # crashed, waiting to restart
    FAILED = "failed"  # crash loop: given up
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Readiness:
    ready: bool
    reason: str


def decide_readiness(*, started: bool, draining: bool, gave_up_critical: Sequence[str]) -> Readiness:
    """Ready only after start-up, before draining, and while no critical daemon was given up."""
    if draining:
        return Readiness(False, "draining")
    if gave_up_critical:
        return Readiness(False, "critical daemon gave up: " + ", ".join(sorted(gave_up_critical)))
    if not started:
        return Readiness(False, "starting")
    return Readiness(True, "ready")


@dataclass(eq=False)
class DaemonStatus:
    """Mutable bookkeeping of one supervised daemon."""

    spec: DaemonSpec
    state: DaemonState = DaemonState.PENDING
    restarts: int = 0
    last_error: str | None = None
    started_at: float | None = None  # wall clock of the latest start
    healthy: bool = False
    delays: list[float] = field(default_factory=list)  # backoff delays chosen so far
    start_times: list[float] = field(default_factory=list)  # monotonic, within the crash window
    health_failure: str | None = None
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    settled: asyncio.Event = field(default_factory=asyncio.Event)  # first heartbeat or given up
    supervisor: asyncio.Task | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "name": self.spec.name,
            "state": self.state.value,
            "critical": self.spec.critical,
            "healthy": self.healthy,
            "restarts": self.restarts,
            "last_error": self.last_error,
            "started_at": self.started_at,
            "next_delay_s": self.delays[-1] if self.state is DaemonState.BACKOFF and self.delays else None,
        }


class DaemonManager:
    def __init__(
        self,
        specs: Sequence[DaemonSpec],
        *,
        router: EventRouter,
        settings: Settings,
        metrics: Metrics | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.router = router
        self.settings = settings
        self.metrics = metrics if metrics is not None else router.metrics
        self._rng = rng if rng is not None else random.Random()
        self._statuses = {s.name: DaemonStatus(s) for s in specs}
        self._started = False
        self._draining = asyncio.Event()
        self._stopped = asyncio.Event()
        self._gave_up_critical: list[str] = []
        self._drain_task: asyncio.Task | None = None
        self._stop_started = False

    # ---- state for the health server -------------------------------------------------------

    def readiness(self) -> Readiness:
        result = decide_readiness(
            started=self._started, draining=self._draining.is_set(), gave_up_critical=self._gave_up_critical
        )
        self.metrics.ready.set(1 if result.ready else 0)
        return result

    def daemon_states(self) -> list[dict[str, Any]]:
        return [st.as_json() for st in self._statuses.values()]

    def status(self, name: str) -> DaemonStatus:
        return self._statuses[name]

    # ---- start -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Launch each daemon once its dependencies have settled (first heartbeat, gave up, or
        their start timeout), then wait for all to settle and become ready."""
        for st in self._statuses.values():
            for dep in st.spec.depends_on:
                dep_st = self._statuses[dep]
                if not await self._wait_settled(dep_st):
                    log.warning("dependency_not_healthy_yet", daemon=st.spec.name, dependency=dep)
            if self._draining.is_set():
                return
            st.supervisor = asyncio.create_task(self._supervise(st), name=f"supervise:{st.spec.name}")
        for st in self._statuses.values():
            await self._wait_settled(st)
        if not self._draining.is_set():
            self._started = True
            log.info("daemons_started", daemons=list(self._statuses))

    async def _wait_settled(self, st: DaemonStatus) -> bool:
        """Wait until `st` settled, draining began, or its start timeout; True when settled."""
        waiters = [asyncio.create_task(st.settled.wait()), asyncio.create_task(self._draining.wait())]
        try:
            await asyncio.wait(waiters, timeout=st.spec.start_timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        return st.settled.is_set()

    # ---- supervision -----------------------------------------------------------------------

    async def _supervise(self, st: DaemonStatus) -> None:
        spec, policy = st.spec, st.spec.restart
        loop = asyncio.get_running_loop()
        attempt = 0
        while not st.stopping.is_set():
            began = loop.time()
            st.start_times = [t for t in st.start_times if t > began - policy.crash_loop_window_s] + [began]
            st.state, st.started_at, st.healthy, st.health_failure = DaemonState.RUNNING, time.time(), False, None
            error = await self._run_once(st)
            if error is None or st.stopping.is_set():
                break
            if self._draining.is_set():  # the node is going down: nothing is restarted any more
                st.last_error = error
                log.warning("daemon_ended_while_draining", daemon=spec.name, error=error)
                break
            st.last_error, st.healthy = error, False
            self.metrics.daemon_healthy.labels(spec.name).set(0)
            if should_reset_backoff(loop.time() - began, policy.reset_after_s):
                attempt = 0
            if is_crash_loop(st.start_times, loop.time(), policy.crash_loop_starts, policy.crash_loop_window_s):
                await self._give_up(st)
                return
            delay = restart_delay(attempt, policy.base_s, policy.cap_s, self._rng)
            attempt += 1
            st.restarts += 1
            st.delays.append(delay)
            st.state = DaemonState.BACKOFF
            self.metrics.daemon_restarts_total.labels(spec.name).inc()
            log.warning("daemon_crashed", daemon=spec.name, error=error, restart_in_s=round(delay, 3))
            if await _sleep_or_event(delay, st.stopping):
                break
        st.state = DaemonState.STOPPED

    async def _run_once(self, st: DaemonStatus) -> str | None:
        """Run the runner once; None for a clean stop, else why it ended."""
        ctx = self._context(st)
        task = asyncio.create_task(st.spec.runner(ctx), name=f"daemon:{st.spec.name}")
        monitor = asyncio.create_task(self._health_loop(st, ctx, task))
        try:
            await asyncio.wait({task})
        finally:
            monitor.cancel()
            if not task.done():  # we are being cancelled (drain deadline): take the runner along
                task.cancel()
                await asyncio.wait({task}, timeout=1.0)
        if task.cancelled():
            return st.health_failure or "cancelled"
        if (exc := task.exception()) is not None:
            return f"{type(exc).__name__}: {exc}"
        if not st.stopping.is_set():
            return "runner returned before it was asked to stop"
        return None

    def _context(self, st: DaemonStatus) -> DaemonContext:
        def on_healthy() -> None:
            st.healthy = True
            st.settled.set()
            self.metrics.daemon_healthy.labels(st.spec.name).set(1)

        return DaemonContext(
            name=st.spec.name,
            settings=st.spec.settings,
            router=self.router,
            app_settings=self.settings,
            stopping=st.stopping,
            log=get_logger(f"daemon.{st.spec.name}").bind(daemon=st.spec.name),
            metrics=self.metrics,
            on_healthy=on_healthy,
        )

    async def _health_loop(self, st: DaemonStatus, ctx: DaemonContext, task: asyncio.Task) -> None:
        started = time.monotonic()
        while not task.done():
            await asyncio.sleep(st.spec.health_interval_s)
            if task.done() or st.stopping.is_set():
                return
            problem = await self._health_problem(st, ctx, started)
            st.healthy = problem is None
            self.metrics.daemon_healthy.labels(st.spec.name).set(1 if st.healthy else 0)
            if problem is not None:
                st.health_failure = f"health check failed: {problem}"
                log.warning("daemon_unhealthy", daemon=st.spec.name, problem=problem)
                task.cancel()
                return

    async def _health_problem(self, st: DaemonStatus, ctx: DaemonContext, started: float) -> str | None:
        spec = st.spec
        if spec.health is not None:
            try:
                result = spec.health(ctx)
                if inspect.isawaitable(result):
                    result = await asyncio.wait_for(result, timeout=spec.health_interval_s)
            except Exception as exc:  # noqa: BLE001 - a broken check is a failed check
                return f"{type(exc).__name__}: {exc}"
            return None if result else "health check returned false"
        if spec.heartbeat_timeout_s is not None:
            age = ctx.heartbeat_age()
            age = time.monotonic() - started if age is None else age
            if age > spec.heartbeat_timeout_s:
                return f"no heartbeat for {age:.1f} s"
        return None

    async def _give_up(self, st: DaemonStatus) -> None:
        spec = st.spec
        st.state = DaemonState.FAILED
        st.settled.set()
        if spec.critical:
            self._gave_up_critical.append(spec.name)
        log.error("daemon_crash_loop", daemon=spec.name, starts=len(st.start_times), critical=spec.critical)
        try:
            await self.router.publish(
                EventType.DAEMON_CRASH_LOOP,
                {
                    "daemon": spec.name,
                    "node_id": self.settings.node.node_id,
                    "starts": len(st.start_times),
                    "window_s": spec.restart.crash_loop_window_s,
                    "critical": spec.critical,
                    "last_error": st.last_error or "",
                },
            )
        except Exception as exc:  # noqa: BLE001 - reporting must not hide the give-up itself
            log.error("crash_loop_event_failed", daemon=spec.name, error=str(exc))

    # ---- stop ------------------------------------------------------------------------------

    def begin_drain(self) -> None:
        """Flip readiness to 503 at once; the actual stopping follows in drain_and_stop."""
        self._draining.set()
        self.readiness()

    async def drain_and_stop(self, deadline_s: float = 30.0) -> None:
        """Stop every daemon within about `deadline_s` seconds, dependents before dependencies.

        Daemons with no dependency between them stop concurrently, so one slow daemon cannot
        eat the drain time of the others. Each gets its `stop_timeout_s` (bounded by what is
        left of the deadline) to return after `stopping` is set; one that overruns is cancelled.
        A second call waits for the first.
        """
        self.begin_drain()
        if self._stop_started:
            await self._stopped.wait()
            return
        self._stop_started = True
        started = asyncio.get_running_loop().time()
        deadline = started + deadline_s
        log.info("drain_started", deadline_s=deadline_s, daemons=len(self._statuses))
        stopped = {name: asyncio.Event() for name in self._statuses}
        dependents = {
            name: [other for other, st in self._statuses.items() if name in st.spec.depends_on]
            for name in self._statuses
        }

        async def stop_after_dependents(st: DaemonStatus) -> None:
            try:
                for dependent in dependents[st.spec.name]:
                    await stopped[dependent].wait()
                await self._stop_one(st, deadline)
            finally:
                stopped[st.spec.name].set()

        await asyncio.gather(*(stop_after_dependents(st) for st in self._statuses.values()))
        self._stopped.set()
        log.info("daemons_stopped", drain_s=round(asyncio.get_running_loop().time() - started, 3))

    async def _stop_one(self, st: DaemonStatus, deadline: float) -> None:
        loop = asyncio.get_running_loop()
        st.stopping.set()
        if st.supervisor is None or st.supervisor.done():
            if st.state is not DaemonState.FAILED:
                st.state = DaemonState.STOPPED
            return
        if st.state is not DaemonState.FAILED:
            st.state = DaemonState.STOPPING
        timeout = max(0.0, min(st.spec.stop_timeout_s, deadline - loop.time()))
        done, _ = await asyncio.wait({st.supervisor}, timeout=timeout)
        if not done:
            log.warning("daemon_stop_timeout", daemon=st.spec.name, timeout_s=round(timeout, 3))
            st.supervisor.cancel()
            await asyncio.wait({st.supervisor}, timeout=max(0.1, min(1.0, deadline - loop.time())))
        if st.state is not DaemonState.FAILED:
            st.state = DaemonState.STOPPED

    def install_signal_handlers(
        self, deadline_s: float = 30.0, signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT)
    ) -> None:
        """On the first signal: readiness goes 503 immediately, then drain_and_stop runs;
        `wait_stopped()` returns when it is done."""
        loop = asyncio.get_running_loop()
        for sig in signals:
            loop.add_signal_handler(sig, self._on_signal, sig, deadline_s)

    def _on_signal(self, sig: signal.Signals, deadline_s: float) -> None:
        if self._drain_task is not None:
            return
        log.info("shutdown_signal", signal=sig.name, deadline_s=deadline_s)
        self.begin_drain()
        self._drain_task = asyncio.get_running_loop().create_task(self.drain_and_stop(deadline_s))

    async def wait_stopped(self) -> None:
        await self._stopped.wait()

    async def wait_draining(self) -> None:
        """Return once the drain has begun (a signal, /admin/drain or --max-generations)."""
        await self._draining.wait()


async def _sleep_or_event(seconds: float, event: asyncio.Event) -> bool:
    """Sleep up to `seconds`; True when `event` was set (early or by then)."""
    try:
        await asyncio.wait_for(event.wait(), timeout=seconds)
    except TimeoutError:
        pass
    return event.is_set()
