"""Health server endpoints against a real DaemonManager, over real HTTP on loopback."""


import aiohttp
import pytest

from app.config import Settings
from app.coordination.daemons.manager import DaemonManager
from app.coordination.daemons.registry import build_registry
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.events import EventType
from app.coordination.daemons.health_server import HealthServer
from app.coordination.daemons.metrics import Metrics

pytestmark = pytest.mark.timeout(20)


async def worker(ctx):
    ctx.mark_healthy()
    await ctx.stopping.wait()


@pytest.fixture
async def node():
    router = EventRouter()
    registry = build_registry({"daemons": {"worker": {"critical": True}}}, {"worker": (worker, {})})
    manager = DaemonManager(registry.select("all"), router=router, settings=Settings())
    server = HealthServer(manager, router.metrics, port=0)
    await server.start()
    async with aiohttp.ClientSession() as http:
        yield manager, server, http
    await manager.drain_and_stop(deadline_s=2)
    await server.stop()


async def get(http, url):
    async with http.get(url) as resp:
        return resp.status, resp.headers.get("Content-Type", ""), await resp.read()


async def test_readyz_follows_the_manager_from_starting_to_ready_to_draining(node):
    manager, server, http = node
    status, _, body = await get(http, f"{server.url}/readyz")
    assert status == 503 and b"starting" in body
    assert (await get(http, f"{server.url}/livez"))[0] == 200
    await manager.start()
    status, _, body = await get(http, f"{server.url}/readyz")
    assert status == 200 and b'"ready": true' in body
    manager.begin_drain()
    status, _, body = await get(http, f"{server.url}/readyz")
    assert status == 503 and b"draining" in body
    assert (await get(http, f"{server.url}/livez"))[0] == 200


async def test_metrics_are_prometheus_text_with_the_pipeline_series(node):
    manager, server, http = node
    m = manager.metrics
    m.games_total.inc(3)
    m.positions_per_second.set(1234.5)
    m.training_loss.set(0.75)
    m.elo.labels(generation="2").set(1510)
    m.generation.set(2)
    m.promotions_total.inc()
    await manager.router.publish(EventType.LEADER_ELECTED, {"term": 1, "leader_id": "a"})
    status, ctype, body = await get(http, f"{server.url}/metrics")
    text = body.decode()
    assert status == 200 and ctype.startswith("text/plain")
    for line in [
        "games_total 3.0",
        "positions_per_second 1234.5",
        "training_loss 0.75",
        'elo{generation="2"} 1510.0',
        "generation 2.0",
        "promotions_total 1.0",
        'events_published_total{type="leader_elected"} 1.0',
    ]:
        assert line in text.splitlines(), line
    assert "# TYPE daemon_restarts_total counter" in text


async def test_daemons_endpoint_lists_each_daemon_state(node):
    manager, server, http = node
    await manager.start()
    async with http.get(f"{server.url}/daemons") as resp:
        body = await resp.json()
    [worker_state] = body["daemons"]
    assert worker_state["name"] == "worker" and worker_state["state"] == "running"
    assert worker_state["healthy"] is True and worker_state["restarts"] == 0
    assert worker_state["critical"] is True and worker_state["last_error"] is None
    assert isinstance(worker_state["started_at"], float)
    assert (await get(http, f"{server.url}/nope"))[0] == 404


def test_each_metrics_object_has_its_own_registry():
    a, b = Metrics(), Metrics()
    a.games_total.inc()
    assert b.registry.get_sample_value("games_total") == 0.0
    assert a.registry.get_sample_value("games_total") == 1.0
