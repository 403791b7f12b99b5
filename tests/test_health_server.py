"""Health server endpoints against a real DaemonManager, over real HTTP on loopback."""


import aiohttp
import pytest

from app.config import Settings
from app.coordination.daemons.manager import DaemonManager
from app.coordination.daemons.daemon_registry import build_registry
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
    status, _, body = await get(http, f"{server.url}/metrics")
    before = body.decode()
    # No fake zero: a gauge with no value yet is absent; a counter's 0 is real.
    assert "mesh_training_loss{" not in before and "mesh_model_generation{" not in before
    assert 'mesh_selfplay_items_total{node="local"} 0.0' in before.splitlines()
    assert 'mesh_selfplay_games_total{node="local"} 0.0' in before.splitlines()  # the deprecated alias
    m.selfplay_items_total.inc(3)
    m.selfplay_samples_total.inc(126)
    m.selfplay_samples_per_second.set(1234.5)
    m.training_loss.set(0.75)
    m.generation.set(2)
    m.promotions_total.inc()
    m.watch_daemons(manager.daemon_states)
    # Elo: two series (the best's and the newest candidate's), never one per generation
    m.watch_mesh(lambda: {"term": 4, "is_leader": 1, "voters_alive": 3, "quorum_size": 2,
                          "model_elo": {"best": 1510, "candidate": 1490.5}})
    await manager.router.publish(EventType.LEADER_ELECTED, {"term": 1, "leader_id": "a"})
    status, ctype, body = await get(http, f"{server.url}/metrics")
    text = body.decode()
    assert status == 200 and ctype.startswith("text/plain")
    for line in [
        'mesh_selfplay_items_total{node="local"} 3.0',
        'mesh_selfplay_samples_total{node="local"} 126.0',
        'mesh_selfplay_samples_per_second{node="local"} 1234.5',
        # the deprecated names, the same values (DEPRECATED_ALIASES)
        'mesh_selfplay_games_total{node="local"} 3.0',
        'mesh_selfplay_positions_total{node="local"} 126.0',
        'mesh_selfplay_positions_per_second{node="local"} 1234.5',
        'mesh_training_loss{node="local"} 0.75',
        'mesh_model_elo{node="local",role="best"} 1510.0',
        'mesh_model_elo{node="local",role="candidate"} 1490.5',
        'mesh_model_generation{node="local"} 2.0',
        'mesh_promotions_total{node="local"} 1.0',
        'mesh_events_published_total{node="local",type="leader_elected"} 1.0',
        'mesh_daemon_state{critical="true",daemon="worker",node="local",state="pending"} 1.0',
        'mesh_term{node="local"} 4.0',
        'mesh_voters_alive{node="local"} 3.0',
    ]:
        assert line in text.splitlines(), line
    assert "# TYPE mesh_daemon_restarts_total counter" in text
    # what runs: the build, and the process's own CPU and memory (prometheus-client's collectors)
    [build] = [ln for ln in text.splitlines() if ln.startswith("mesh_build_info{")]
    assert 'version="' in build and 'python="' in build and 'revision="' in build and build.endswith(" 1.0")
    assert 'revision="unknown"' not in build  # a checkout: its git commit
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"):
        assert any(ln.startswith(name + "{") for ln in text.splitlines()), name
    names = {ln.split("{")[0].split(" ")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert all(n.startswith(("mesh_", "process_", "python_")) for n in names), names
    # every series says which node it is from
    assert all('node="local"' in ln for ln in text.splitlines() if ln and not ln.startswith("#"))


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
    a, b = Metrics(node="a"), Metrics(node="b")
    a.selfplay_items_total.inc()
    assert b.value("mesh_selfplay_games_total") == 0.0
    assert a.value("mesh_selfplay_games_total") == 1.0


async def test_dashboard_page_and_data_without_and_with_a_cluster_source():
    router = EventRouter()
    registry = build_registry({"daemons": {"worker": {"critical": True}}}, {"worker": (worker, {})})
    manager = DaemonManager(registry.select("all"), router=router, settings=Settings())
    calls = []

    def source():
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("gossip not ready")
        return {"nodes": [{"node_id": "a", "role": "leader"}], "generations": []}

    bare = HealthServer(manager, router.metrics, port=0)
    with_source = HealthServer(manager, router.metrics, port=0, dashboard=source)
    await bare.start()
    await with_source.start()
    try:
        async with aiohttp.ClientSession() as http:
            status, ctype, page = await get(http, f"{bare.url}/")
            assert status == 200 and ctype.startswith("text/html") and b"dashboard.json" in page
            assert b"http://" not in page and b"https://" not in page  # nothing fetched from the network
            async with http.get(f"{bare.url}/dashboard.json") as resp:
                data = await resp.json()
            assert data["node"] == "local" and data["daemons"][0]["name"] == "worker" and "nodes" not in data
            async with http.get(f"{with_source.url}/dashboard.json") as resp:
                assert (await resp.json())["nodes"][0]["role"] == "leader"
            async with http.get(f"{with_source.url}/dashboard.json") as resp:
                data = await resp.json()
            assert resp.status == 200 and "gossip not ready" in data["error"] and data["daemons"]
    finally:
        await bare.stop()
        await with_source.stop()


def test_several_configs_serve_one_metrics_page_each_lineage_series_labelled_by_its_config():
    """Issue 52: a second config's daemon counters are on /metrics beside the first's, told
    apart by `config`; the process-wide series once and unlabelled; one family per name (the
    text format allows one), the scheduler's own `config` label kept."""
    from prometheus_client import Gauge
    from prometheus_client.parser import text_string_to_metric_families

    first, second = Metrics(node="n1"), Metrics(node="n1", node_wide=False)
    first.selfplay_items_total.inc(3)
    second.selfplay_items_total.inc(5)
    second.daemon_restarts_total.labels("selfplay").inc()
    Gauge("mesh_config_share", "share", ["node", "config"], registry=first.registry).labels("n1", "small").set(0.4)
    first.add_configs("c4", [("small", second)])
    text = first.render().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    type_lines = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(type_lines) == len(set(type_lines))
    items = {s.labels["config"]: s.value for s in families["mesh_selfplay_items"].samples if s.name.endswith("_total")}
    assert items == {"c4": 3.0, "small": 5.0}
    restarts = [s for s in families["mesh_daemon_restarts"].samples if s.name.endswith("_total")]
    assert [(s.labels["config"], s.labels["daemon"], s.value) for s in restarts] == [("small", "selfplay", 1.0)]
    assert all("config" not in s.labels and s.labels["node"] == "n1" for s in families["mesh_build_info"].samples)
    assert [s.labels["config"] for s in families["mesh_config_share"].samples] == ["small"]  # its own label kept
    assert first.value("mesh_selfplay_items_total") == 3.0  # the registry itself is unchanged
