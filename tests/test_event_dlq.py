"""Dead-letter queue: failed deliveries persisted in a real SQLite file, retried, abandoned."""

import asyncio
import random

import pytest

from app.config import Settings
from app.coordination.daemons.manager import DaemonManager
from app.coordination.daemons.daemon_registry import build_registry
from app.coordination.daemons.dlq_retry import INFRA_RUNNERS
from app.coordination.daemons.event_router import EventRouter, RetryPolicy
from app.coordination.daemons.events import EventType
from app.db.dead_letters import DeadLetterStatus, DeadLetterStore

pytestmark = pytest.mark.timeout(20)
SHA = "cd" * 32
PROMOTED = {"generation": 2, "sha256": SHA, "path": "models/g2.safetensors"}


class Clock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class FlakyHandler:
    """Fails the first `failures` calls, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def __call__(self, event) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"peer unreachable (call {self.calls})")


@pytest.fixture
def store(tmp_path):
    s = DeadLetterStore(tmp_path / "dlq.sqlite")
    yield s
    s.close()


def router_with(store, clock, **kw) -> EventRouter:
    policy = RetryPolicy(base_s=10, cap_s=1000, max_attempts=kw.pop("max_attempts", 4))
    return EventRouter(dead_letters=store, clock=clock, retry_policy=policy, rng=random.Random(3), **kw)


async def test_failed_handler_lands_in_dlq_once_and_a_retry_delivers_it(store):
    clock = Clock()
    router = router_with(store, clock)
    flaky, ok_calls = FlakyHandler(failures=1), []

    async def ok(event):
        ok_calls.append(event.payload.generation)

    router.subscribe(EventType.MODEL_PROMOTED, flaky, name="distribute")
    router.subscribe(EventType.MODEL_PROMOTED, ok, name="record")
    first = await router.publish(EventType.MODEL_PROMOTED, PROMOTED)
    dup = await router.publish(EventType.MODEL_PROMOTED, PROMOTED)
    assert (first.delivered, first.failed, dup.duplicate) == (1, 1, True)
    assert flaky.calls == 1 and ok_calls == [2]  # the duplicate reached nobody

    [letter] = store.letters()
    assert (letter.handler, letter.event_type, letter.attempts) == ("distribute", "model_promoted", 1)
    assert letter.status is DeadLetterStatus.PENDING
    assert letter.error == "ConnectionError: peer unreachable (call 1)"
    assert 1_005 <= letter.next_retry_at <= 1_010  # base 10 s with equal jitter

    assert (await router.retry_due()).retried == 0  # not due yet
    clock.now = letter.next_retry_at
    report = await router.retry_due()
    assert (report.retried, report.delivered) == (1, 1)
    assert flaky.calls == 2 and ok_calls == [2]  # only the failed handler is re-invoked
    [letter] = store.letters()
    assert letter.status is DeadLetterStatus.DELIVERED and letter.attempts == 2


async def test_retries_back_off_then_abandon_and_survive_a_restart(tmp_path):
    path = tmp_path / "dlq.sqlite"
    clock = Clock()
    store = DeadLetterStore(path)
    router = router_with(store, clock, max_attempts=4)
    router.subscribe(EventType.TRAINING_FAILED, FlakyHandler(failures=99), name="requeue")
    await router.publish(EventType.TRAINING_FAILED, {"generation": 1, "node_id": "n1", "error": "oom"})
    store.close()

    gaps = []
    for attempt in range(2, 5):
        # A "restart" before each retry: fresh store and router on the same file.
        store = DeadLetterStore(path)
        router = router_with(store, clock, max_attempts=4)
        router.subscribe(EventType.TRAINING_FAILED, FlakyHandler(failures=99), name="requeue")
        [letter] = store.letters()
        assert letter.attempts == attempt - 1 and letter.status is DeadLetterStatus.PENDING
        gaps.append(letter.next_retry_at - clock.now)
        clock.now = letter.next_retry_at
        report = await router.retry_due()
        assert report.failed == 1 and report.abandoned == (attempt == 4)
        store.close()

    store = DeadLetterStore(path)
    [letter] = store.letters()
    assert letter.status is DeadLetterStatus.ABANDONED and letter.attempts == 4
    assert store.counts()[DeadLetterStatus.ABANDONED] == 1
    assert all(a < b for a, b in zip(gaps, gaps[1:]))  # 10ish, 20ish, 40ish
    assert store.due(clock.now + 10**6) == []  # abandoned letters are never retried
    store.close()


async def test_letter_for_an_unregistered_handler_fails_with_a_clear_error(store):
    clock = Clock()
    router = router_with(store, clock)
    router.subscribe(EventType.LEADER_ELECTED, FlakyHandler(failures=1), name="gone")
    await router.publish(EventType.LEADER_ELECTED, {"term": 4, "leader_id": "n2"})
    router.unsubscribe(EventType.LEADER_ELECTED, "gone")
    clock.now += 10**4
    report = await router.retry_due()
    assert report.failed == 1
    assert "no handler named 'gone' for LEADER_ELECTED" in store.letters()[0].error


async def test_dlq_retry_daemon_redelivers_under_the_manager(store):
    router = EventRouter(dead_letters=store, retry_policy=RetryPolicy(base_s=0.05, cap_s=0.2, max_attempts=5))
    flaky = FlakyHandler(failures=2)
    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, flaky, name="export_trigger")
    registry = build_registry(
        {"daemons": {"dlq_retry": {"heartbeat_timeout_s": 5, "settings": {"interval_s": 0.02}}}}, INFRA_RUNNERS
    )
    manager = DaemonManager(registry.select("all"), router=router, settings=Settings())
    await manager.start()
    try:
        await router.publish(EventType.NEW_ITEMS_AVAILABLE, {"count": 5, "total": 5})
        for _ in range(500):
            if store.letters()[0].status is DeadLetterStatus.DELIVERED:
                break
            await asyncio.sleep(0.02)
        [letter] = store.letters()
        assert letter.status is DeadLetterStatus.DELIVERED and letter.attempts == 3
        assert flaky.calls == 3
        assert manager.status("dlq_retry").healthy
    finally:
        await manager.drain_and_stop(deadline_s=2)
