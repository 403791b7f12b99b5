"""EventRouter: schemas, dedup, handler isolation and timeouts, metrics."""

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.coordination.daemons.event_router import DedupCache, EventRouter
from app.coordination.daemons.events import (
    PAYLOAD_SCHEMAS,
    EventPayloadError,
    EventType,
    ModelPromoted,
    NewItemsAvailable,
    event_key,
    validate_payload,
)

pytestmark = pytest.mark.timeout(20)
SHA = "ab" * 32


def sample(metrics, name, event_type):
    value = metrics.value(f"mesh_{name}", type=event_type.value)
    return 0.0 if value is None else value


def test_every_event_type_has_a_schema():
    assert set(PAYLOAD_SCHEMAS) == set(EventType)


@pytest.mark.parametrize(
    "event_type, payload, needle",
    [
        (EventType.NEW_ITEMS_AVAILABLE, {"count": 1}, "total: Field required"),
        (EventType.NEW_ITEMS_AVAILABLE, {"count": -1, "total": 3}, "count"),
        (EventType.NEW_ITEMS_AVAILABLE, {"count": 1, "total": 3, "cuont": 1}, "cuont"),
        (EventType.MODEL_PROMOTED, {"generation": 1, "sha256": "xyz", "path": "m"}, "sha256"),
        (EventType.MODEL_PROMOTED, NewItemsAvailable(count=1, total=1), "takes a ModelPromoted payload"),
        (EventType.LEADER_ELECTED, ["term", 1], "must be a mapping"),
        ("no_such_event", {}, "unknown event type"),
    ],
)
async def test_publish_rejects_payloads_that_do_not_match_the_schema(event_type, payload, needle):
    router = EventRouter()
    with pytest.raises(EventPayloadError, match=needle):
        await router.publish(event_type, payload)


@given(count=st.integers(0, 10**6), total=st.integers(0, 10**6))
def test_event_key_depends_on_content_not_on_construction(count, total):
    a = validate_payload(EventType.NEW_ITEMS_AVAILABLE, {"total": total, "count": count})
    b = NewItemsAvailable(count=count, total=total)
    assert event_key(EventType.NEW_ITEMS_AVAILABLE, a) == event_key(EventType.NEW_ITEMS_AVAILABLE, b)
    other = NewItemsAvailable(count=count + 1, total=total)
    assert event_key(EventType.NEW_ITEMS_AVAILABLE, other) != event_key(EventType.NEW_ITEMS_AVAILABLE, b)


async def test_duplicate_within_ttl_is_delivered_once_and_again_after_ttl():
    now = [100.0]
    router = EventRouter(dedup_ttl_s=60, monotonic=lambda: now[0])  # a controllable TTL clock
    received = []

    async def handler(event):
        received.append(event.payload)

    router.subscribe(EventType.MODEL_PROMOTED, handler)
    payload = {"generation": 3, "sha256": SHA, "path": "models/g3.safetensors"}
    first = await router.publish(EventType.MODEL_PROMOTED, payload)
    again = await router.publish(EventType.MODEL_PROMOTED, ModelPromoted(**payload))
    assert (first.duplicate, first.delivered, again.duplicate, again.delivered) == (False, 1, True, 0)
    other = await router.publish(EventType.MODEL_PROMOTED, {**payload, "generation": 4})
    assert not other.duplicate
    now[0] += 61
    late = await router.publish(EventType.MODEL_PROMOTED, payload)
    assert not late.duplicate
    assert [p.generation for p in received] == [3, 4, 3]
    m, t = router.metrics, EventType.MODEL_PROMOTED
    assert sample(m, "events_published_total", t) == 3
    assert sample(m, "events_duplicate_total", t) == 1
    assert sample(m, "events_delivered_total", t) == 3


async def test_handlers_are_isolated_from_raising_and_hanging_neighbours():
    router = EventRouter(handler_timeout_s=0.2)
    got = []

    async def good(event):
        got.append(event.payload.total)

    async def bad(event):
        raise RuntimeError("handler bug")

    async def hangs(event):
        await asyncio.sleep(3600)

    async def slow_but_allowed(event):
        await asyncio.sleep(0.3)
        got.append("slow")

    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, bad, name="bad")
    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, hangs, name="hangs")
    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, good, name="good")
    router.subscribe(EventType.NEW_ITEMS_AVAILABLE, slow_but_allowed, name="slow", timeout_s=2)
    # the hanging handler (an hour) is cut off at its timeout: publish returns well within the deadline
    result = await asyncio.wait_for(router.publish(EventType.NEW_ITEMS_AVAILABLE, {"count": 2, "total": 10}), 30)
    assert (result.delivered, result.failed) == (2, 2)
    assert sorted(map(str, got)) == ["10", "slow"]
    t = EventType.NEW_ITEMS_AVAILABLE
    assert sample(router.metrics, "events_failed_total", t) == 2
    # Handlers of other types are untouched.
    assert router.handlers(EventType.MODEL_PROMOTED) == []


def test_handler_names_must_be_unique_per_event_type():
    router = EventRouter()

    async def h(event):
        pass

    router.subscribe(EventType.TRAINING_STARTED, h, name="x")
    router.subscribe(EventType.TRAINING_FAILED, h, name="x")  # other type: fine
    with pytest.raises(ValueError, match="already subscribed"):
        router.subscribe(EventType.TRAINING_STARTED, h, name="x")
    router.unsubscribe(EventType.TRAINING_STARTED, "x")
    assert router.handlers(EventType.TRAINING_STARTED) == []


def test_dedup_cache_forgets_expired_keys():
    now = [0.0]
    cache = DedupCache(10, clock=lambda: now[0])
    assert not cache.check_and_add("a") and cache.check_and_add("a")
    now[0] = 10.5
    assert not cache.check_and_add("b")
    assert len(cache) == 1  # "a" expired and was pruned
