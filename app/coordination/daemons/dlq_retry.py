"""The dead-letter retry daemon: handlers that failed (I/O that timed out, a peer that was
down) get their event again with backoff, so a transient failure loses no event."""

from __future__ import annotations

from typing import Any

from app.coordination.daemons.event_router import RetryPolicy
from app.coordination.daemons.registry import DaemonContext


DLQ_RETRY_DEFAULTS: dict[str, Any] = {
    "interval_s": 5.0,  # how often to look for due letters
    "base_s": None,  # None: keep the router's RetryPolicy value
    "cap_s": None,
    "max_attempts": None,
}


async def dlq_retry_runner(ctx: DaemonContext) -> None:
    """Daemon: retry due dead letters every `interval_s` until stopped."""
    interval = float(ctx.settings.get("interval_s") or DLQ_RETRY_DEFAULTS["interval_s"])
    default = ctx.router.retry_policy

    def pick(key: str, fallback: float) -> float:
        value = ctx.settings.get(key)
        return fallback if value is None else value

    policy = RetryPolicy(
        base_s=float(pick("base_s", default.base_s)),
        cap_s=float(pick("cap_s", default.cap_s)),
        max_attempts=int(pick("max_attempts", default.max_attempts)),
    )
    while not ctx.stopping.is_set():
        report = await ctx.router.retry_due(policy)
        if report.retried:
            ctx.log.info("dead_letters_retried", **report.__dict__)
        ctx.mark_healthy()
        await ctx.sleep(interval)


# Runner-table entries (runner, default settings) of the infrastructure daemons, merged by the
# orchestrator with the pipeline runners before loading daemons.yaml.
INFRA_RUNNERS: dict[str, tuple[Any, dict[str, Any]]] = {"dlq_retry": (dlq_retry_runner, DLQ_RETRY_DEFAULTS)}
