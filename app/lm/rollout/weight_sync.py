"""Weight sync: every engine loads the new weights, in parallel, each within its own
`sync_timeout_s`. The one place an engine's `weight_version` and `in_service` change after a
load, so the online loop and the mesh (a promotion) keep the same rules:

- the version an engine's rollouts carry is the one the engine reported after the load;
- a failed or timed-out load takes the engine out of service (its error shown in /status)
  until a later load succeeds; the engine itself puts its config back as it was;
- a load waits for the engine's lock, so it never overlaps a generation on that engine.

One hung engine costs its own timeout, not the sum; every failure is reported with the
engine's name, and the ones that did succeed are listed too (they serve the new version,
the failed ones do not: the caller decides what that means).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import structlog

from app.lm.rollout.engine import Engine, WeightUpdate

log = structlog.get_logger(__name__)


class WeightSyncError(RuntimeError):
    def __init__(self, version: int, failures: dict[str, str], synced: list[str]) -> None:
        self.version, self.failures, self.synced = version, failures, synced
        detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
        super().__init__(f"weight sync to version {version} failed on {len(failures)} of "
                         f"{len(failures) + len(synced)} engines: {detail} (synced: {synced or 'none'})")


@dataclass
class SyncReport:
    version: int
    seconds: dict[str, float] = field(default_factory=dict)   # per engine, wall time of its load


async def _acquire(engine: Engine) -> None:
    """The engine's lock, waiting out a generation in flight (at most its sync timeout). A
    cancelled wait releases the lock once the waiting thread gets it."""
    lock = engine.lock
    waiting = asyncio.ensure_future(asyncio.to_thread(lock.acquire, True, engine.sync_timeout_s))
    try:
        got = await asyncio.shield(waiting)
    except asyncio.CancelledError:
        waiting.add_done_callback(lambda t: lock.release() if not t.cancelled() and t.result() else None)
        raise
    if not got:
        engine.in_service, engine.last_error = False, "still generating after sync_timeout_s: load not started"
        raise TimeoutError(f"engine {engine.name} stayed busy generating for {engine.sync_timeout_s:g}s")


async def _one(engine: Engine, update: WeightUpdate) -> float:
    start = time.perf_counter()
    await _acquire(engine)
    try:
        try:
            reported = await asyncio.wait_for(engine.load(update), engine.sync_timeout_s)
        except TimeoutError:
            raise TimeoutError(f"no answer within sync_timeout_s {engine.sync_timeout_s:g}s") from None
        if reported != update.version:
            raise RuntimeError(f"loaded version {update.version}, but the engine reports {reported}")
        engine.weight_version, engine.in_service, engine.last_error = reported, True, None
    except Exception as exc:
        engine.in_service, engine.last_error = False, f"{type(exc).__name__}: {exc}"[:500]
        raise
    finally:
        engine.lock.release()
    return time.perf_counter() - start


async def sync_engines(engines: Sequence[Engine], update: WeightUpdate) -> SyncReport:
    """Load `update` into every engine; raise `WeightSyncError` naming each failure."""
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise ValueError(f"engine names must be distinct to report failures: {names}")
    results = await asyncio.gather(*(_one(e, update) for e in engines), return_exceptions=True)
    failures: dict[str, str] = {}
    report = SyncReport(version=update.version)
    for engine, result in zip(engines, results):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result   # cancellation and interpreter exits are not engine failures
            failures[engine.name] = f"{type(result).__name__}: {result}"
        else:
            report.seconds[engine.name] = result
    if failures:
        log.error("weight_sync_failed", version=update.version, failures=failures, synced=list(report.seconds))
        raise WeightSyncError(update.version, failures, list(report.seconds))
    log.info("weight_sync_done", version=update.version, path=str(update.path) if update.path else None,
             seconds=report.seconds)
    return report


def sync_engines_blocking(engines: Sequence[Engine], update: WeightUpdate) -> SyncReport:
    """`sync_engines` from code outside an event loop (the online loop, self-play's thread)."""
    return asyncio.run(sync_engines(engines, update))


async def start_engines(engines: Sequence[Engine]) -> None:
    """Every engine's start-up checks (a vLLM server in the wrong log-prob mode is refused here)."""
    await asyncio.gather(*(e.start() for e in engines))


def start_engines_blocking(engines: Sequence[Engine]) -> None:
    asyncio.run(start_engines(engines))
