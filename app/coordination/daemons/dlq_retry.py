"""The dead-letter retry daemon: handlers that failed (I/O that timed out, a peer that was
down) get their event again with backoff, so a transient failure loses no event."""

from __future__ import annotations

from pydantic import Field

from app.config.base import StrictModel
from app.coordination.daemons.event_router import RetryPolicy
from app.coordination.daemons.daemon_registry import DaemonContext, RunnerEntry


class DlqRetrySettings(StrictModel):
    interval_s: float = Field(5.0, gt=0)  # how often to look for due letters
    base_s: float | None = Field(None, gt=0)  # None: keep the router's RetryPolicy value
    cap_s: float | None = Field(None, gt=0)
    max_attempts: int | None = Field(None, ge=1)


async def dlq_retry_runner(ctx: DaemonContext[DlqRetrySettings]) -> None:
    """Daemon: retry due dead letters every `interval_s` until stopped."""
    cfg = ctx.settings
    default = ctx.router.retry_policy
    policy = RetryPolicy(
        base_s=default.base_s if cfg.base_s is None else cfg.base_s,
        cap_s=default.cap_s if cfg.cap_s is None else cfg.cap_s,
        max_attempts=default.max_attempts if cfg.max_attempts is None else cfg.max_attempts,
    )
    while not ctx.stopping.is_set():
        report = await ctx.router.retry_due(policy)
        if report.retried:
            ctx.log.info("dead_letters_retried", **report.__dict__)
        ctx.mark_healthy()
        await ctx.sleep(cfg.interval_s)


# Runner-table entries of the infrastructure daemons, merged by the orchestrator with the
# pipeline runners before loading daemons.yaml.
INFRA_RUNNERS: dict[str, RunnerEntry] = {"dlq_retry": RunnerEntry(dlq_retry_runner, DlqRetrySettings)}
