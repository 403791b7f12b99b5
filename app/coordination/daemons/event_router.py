"""In-process typed publish/subscribe with SHA-256 dedup and a persisted dead-letter queue.

Why each piece exists:
- handlers run concurrently, each under its own timeout and try/except, so one slow or
  failing handler never blocks or breaks another;
- the same (type, payload) published twice within the TTL is delivered once, because gossip
  and retries make duplicate publications normal in a mesh;
- a failed delivery is written to SQLite with a retry schedule, so a crash or restart loses
  no event; a daemon (`dlq_retry.py`) re-invokes the named handler with backoff and
  gives up after `max_attempts` (status 'abandoned', kept for operators).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from app.coordination.daemons.backoff import restart_delay
from app.coordination.daemons.events import EventType, Payload, canonical_json, event_key, validate_payload
from app.coordination.daemons.metrics import Metrics
from app.db.dead_letters import DeadLetter, DeadLetterStore
from app.log import get_logger


log = get_logger(__name__)


@dataclass(frozen=True)
class Event:
    type: EventType
    payload: Payload
    key: str  # sha256 of type + canonical payload
    published_at: float  # wall-clock seconds


Handler = Callable[[Event], Awaitable[None]]


@dataclass(frozen=True)
class PublishResult:
    event: Event
    duplicate: bool
    delivered: int
    failed: int


@dataclass(frozen=True)
class RetryPolicy:
    base_s: float = 5.0
    cap_s: float = 300.0
    max_attempts: int = 5  # counting the original delivery


@dataclass(frozen=True)
class RetryReport:
    retried: int = 0
    delivered: int = 0
    failed: int = 0
    abandoned: int = 0


@dataclass(frozen=True)
class _Subscription:
    event_type: EventType
    name: str
    handler: Handler
    timeout_s: float


class DedupCache:
    """Keys seen within the last `ttl_s` seconds (monotonic clock)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._clock = clock
        self._expiry: dict[str, float] = {}

    def check_and_add(self, key: str) -> bool:
        """True when `key` was already seen within the TTL; otherwise remember it."""
        now = self._clock()
        self._expiry = {k: t for k, t in self._expiry.items() if t > now}
        if key in self._expiry:
            return True
        self._expiry[key] = now + self.ttl_s
        return False

    def __len__(self) -> int:
        return len(self._expiry)


class EventRouter:
    def __init__(
        self,
        *,
        metrics: Metrics | None = None,
        dead_letters: DeadLetterStore | None = None,
        dedup_ttl_s: float = 300.0,
        handler_timeout_s: float = 10.0,
        retry_policy: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        self.metrics = metrics if metrics is not None else Metrics()
        self.dead_letters = dead_letters
        self.handler_timeout_s = handler_timeout_s
        self.retry_policy = retry_policy
        self._dedup = DedupCache(dedup_ttl_s, monotonic)
        self._clock = clock
        self._rng = rng if rng is not None else random.Random()
        self._subs: dict[tuple[EventType, str], _Subscription] = {}
        self._retry_lock = asyncio.Lock()

    def subscribe(
        self, event_type: EventType, handler: Handler, *, name: str | None = None, timeout_s: float | None = None
    ) -> str:
        """Register `handler` for `event_type`. The name identifies it in the DLQ, so it must be
        stable across restarts and unique per event type; default: module.qualname."""
        event_type = EventType(event_type)
        name = name or f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', repr(handler))}"
        if (event_type, name) in self._subs:
            raise ValueError(f"a handler named {name!r} is already subscribed to {event_type.name}")
        self._subs[(event_type, name)] = _Subscription(
            event_type, name, handler, timeout_s if timeout_s is not None else self.handler_timeout_s
        )
        return name

    def unsubscribe(self, event_type: EventType, name: str) -> None:
        self._subs.pop((EventType(event_type), name), None)

    def handlers(self, event_type: EventType) -> list[str]:
        return [s.name for (t, _), s in self._subs.items() if t == EventType(event_type)]

    async def publish(self, event_type: EventType, payload: Payload | dict[str, Any]) -> PublishResult:
        """Validate, drop if a duplicate, then deliver to every handler and wait for them all.

        Raises EventPayloadError for a payload that does not match the schema. Handler
        failures never raise here: they are counted and written to the dead-letter queue.
        """
        model = validate_payload(event_type, payload)
        event_type = EventType(event_type)
        event = Event(event_type, model, event_key(event_type, model), self._clock())
        label = event_type.value
        if self._dedup.check_and_add(event.key):
            self.metrics.events_duplicate_total.labels(label).inc()
            log.debug("event_duplicate", event_type=label, key=event.key[:12])
            return PublishResult(event, True, 0, 0)
        self.metrics.events_published_total.labels(label).inc()
        subs = [s for (t, _), s in self._subs.items() if t == event_type]
        errors = await asyncio.gather(*(self._invoke(s, event) for s in subs))
        for sub, error in zip(subs, errors):
            if error is not None:
                await self._dead_letter(sub, event, error)
        failed = sum(e is not None for e in errors)
        return PublishResult(event, False, len(subs) - failed, failed)

    async def _invoke(self, sub: _Subscription, event: Event) -> str | None:
        """Run one handler; the error text when it raised or timed out, else None."""
        label = event.type.value
        try:
            async with asyncio.timeout(sub.timeout_s):
                await sub.handler(event)
        except TimeoutError:
            error = f"timed out after {sub.timeout_s:g} s"
        except Exception as exc:  # noqa: BLE001 - isolation is the point
            error = f"{type(exc).__name__}: {exc}"
        else:
            self.metrics.events_delivered_total.labels(label).inc()
            return None
        self.metrics.events_failed_total.labels(label).inc()
        log.warning("event_handler_failed", event_type=label, handler=sub.name, error=error)
        return error

    async def _dead_letter(self, sub: _Subscription, event: Event, error: str) -> None:
        if self.dead_letters is None:
            return
        now = self._clock()
        delay = restart_delay(0, self.retry_policy.base_s, self.retry_policy.cap_s, self._rng)
        try:
            await asyncio.to_thread(
                self.dead_letters.add,
                event_type=event.type.value,
                event_key=event.key,
                payload_json=canonical_json(event.payload),
                handler=sub.name,
                error=error,
                now=now,
                next_retry_at=now + delay,
            )
        except Exception as exc:  # noqa: BLE001 - a DLQ write failure must not break publishers
            log.error("dead_letter_write_failed", handler=sub.name, error=f"{type(exc).__name__}: {exc}")

    async def retry_due(self, policy: RetryPolicy | None = None) -> RetryReport:
        """Re-invoke every dead letter whose retry time has come; reschedule or abandon failures."""
        if self.dead_letters is None:
            return RetryReport()
        policy = policy or self.retry_policy
        async with self._retry_lock:
            now = self._clock()
            letters = await asyncio.to_thread(self.dead_letters.due, now)
            delivered = failed = abandoned = 0
            for letter in letters:
                error = await self._retry_one(letter)
                if error is None:
                    await asyncio.to_thread(self.dead_letters.record_success, letter.id, self._clock())
                    delivered += 1
                    continue
                failed += 1
                attempts = letter.attempts + 1
                give_up = attempts >= policy.max_attempts
                abandoned += give_up
                if give_up:
                    self.metrics.dead_letters_abandoned_total.labels(letter.event_type).inc()
                    log.error("dead_letter_abandoned", handler=letter.handler, attempts=attempts, error=error)
                delay = restart_delay(attempts - 1, policy.base_s, policy.cap_s, self._rng)
                now = self._clock()
                await asyncio.to_thread(
                    self.dead_letters.record_failure,
                    letter.id,
                    error=error,
                    now=now,
                    next_retry_at=now + delay,
                    abandon=give_up,
                )
            return RetryReport(len(letters), delivered, failed, abandoned)

    async def _retry_one(self, letter: DeadLetter) -> str | None:
        try:
            event_type = EventType(letter.event_type)
            payload = validate_payload(event_type, json.loads(letter.payload_json))
        except Exception as exc:  # noqa: BLE001 - a row from an older schema is just a failure
            return f"cannot rebuild event: {exc}"
        sub = self._subs.get((event_type, letter.handler))
        if sub is None:
            return f"no handler named {letter.handler!r} for {event_type.name}"
        return await self._invoke(sub, Event(event_type, payload, letter.event_key, letter.created_at))
