"""Port 8790: /livez, /readyz, /metrics, /daemons, and the dashboard (/ and /dashboard.json).

/livez answers 200 whenever the event loop runs (no dependency checks, so an orchestrator
never kills a node just because a peer is down); /readyz reflects the daemon manager's
readiness (503 while starting, draining, or after a critical daemon gave up). The server
depends on a small protocol, not on DaemonManager, so it can be started before the manager
exists and tested on its own. What it shows of the cluster comes through callbacks the
orchestrator passes in (`dashboard`), never by importing the pipeline or the mesh.
"""

from __future__ import annotations

from typing import Any, Protocol

from aiohttp import web

from app.coordination.daemons.dashboard import DashboardSource, dashboard_routes
from app.coordination.daemons.metrics import METRICS_CONTENT_TYPE, Metrics
from app.log import get_logger

log = get_logger(__name__)


class ReadinessLike(Protocol):
    ready: bool
    reason: str


class HealthSource(Protocol):
    def readiness(self) -> ReadinessLike: ...

    def daemon_states(self) -> list[dict[str, Any]]: ...


def build_health_app(source: HealthSource, metrics: Metrics,
                     dashboard: DashboardSource | None = None) -> web.Application:
    async def livez(_: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def readyz(_: web.Request) -> web.Response:
        result = source.readiness()
        body = {"ready": result.ready, "reason": result.reason}
        return web.json_response(body, status=200 if result.ready else 503)

    async def metrics_handler(_: web.Request) -> web.Response:
        resp = web.Response(body=metrics.render())
        resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return resp

    async def daemons(_: web.Request) -> web.Response:
        return web.json_response({"daemons": source.daemon_states()})

    app = web.Application()
    app.router.add_get("/livez", livez)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    app.router.add_get("/daemons", daemons)

    def local() -> dict[str, Any]:
        ready = source.readiness()
        return {"node": metrics.node, "ready": {"ready": ready.ready, "reason": ready.reason},
                "daemons": source.daemon_states()}

    app.router.add_routes(dashboard_routes(local, dashboard))
    return app


class HealthServer:
    """The health app on host:port; port 0 picks a free port (see `.port` after start)."""

    def __init__(self, source: HealthSource, metrics: Metrics, host: str = "127.0.0.1", port: int = 8790,
                 dashboard: DashboardSource | None = None) -> None:
        self.host, self.port = host, port
        self._runner = web.AppRunner(build_health_app(source, metrics, dashboard), access_log=None,
                                     shutdown_timeout=2.0)

    async def start(self) -> int:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = self._runner.addresses[0][1]
        log.info("health_server_started", host=self.host, port=self.port)
        return self.port

    async def stop(self) -> None:
        await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
