"""Weight sync: after a checkpoint, every inference engine loads it, in parallel.

Each engine gets its own timeout, so one hung engine costs `timeout_s`, not the sum; every
failure is reported with the engine's name, and the ones that did succeed are listed too (they
now serve the new version while the failed ones do not: the caller decides what that means).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)


class SyncableEngine(Protocol):
    name: str
    weight_version: int

    async def update_weights_from_disk(self, model_path: str | Path, version: int) -> None: ...


class WeightSyncError(RuntimeError):
    def __init__(self, version: int, failures: dict[str, str], synced: list[str]) -> None:
        self.version, self.failures, self.synced = version, failures, synced
        detail = "; ".join(f"{name}: {why}" for name, why in failures.items())
        super().__init__(f"weight sync to version {version} failed on {len(failures)} of "
                         f"{len(failures) + len(synced)} engines: {detail} (synced: {synced or 'none'})")


@dataclass
class SyncReport:
    version: int
    seconds: dict[str, float] = field(default_factory=dict)   # per engine, wall time of its update


async def _one(engine: SyncableEngine, model_path: str | Path, version: int, timeout_s: float) -> float:
    start = time.perf_counter()
    try:
        await asyncio.wait_for(engine.update_weights_from_disk(model_path, version), timeout_s)
    except TimeoutError:
        raise TimeoutError(f"no answer within {timeout_s:g}s") from None
    return time.perf_counter() - start


async def sync_weights(engines: Sequence[SyncableEngine], model_path: str | Path, version: int, *,
                       timeout_s: float = 300.0) -> SyncReport:
    """Point every engine at `model_path` as `version`; raise `WeightSyncError` naming each failure."""
    names = [e.name for e in engines]
    if len(set(names)) != len(names):
        raise ValueError(f"engine names must be distinct to report failures: {names}")
    results = await asyncio.gather(*(_one(e, model_path, version, timeout_s) for e in engines),
                                   return_exceptions=True)
    failures: dict[str, str] = {}
    report = SyncReport(version=version)
    for engine, result in zip(engines, results):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result   # cancellation and interpreter exits are not engine failures
            failures[engine.name] = f"{type(result).__name__}: {result}"
        else:
            report.seconds[engine.name] = result
    if failures:
        log.error("weight_sync_failed", version=version, failures=failures, synced=list(report.seconds))
        raise WeightSyncError(version, failures, list(report.seconds))
    log.info("weight_sync_done", version=version, model_path=str(model_path), seconds=report.seconds)
    return report
