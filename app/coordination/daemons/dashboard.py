"""The operator dashboard on the health port: `GET /` (one static HTML page) and
`GET /dashboard.json` (what the page draws).

The page is plain HTML + SVG drawn by its own script (no chart library, no build step, no
network: it works on an air-gapped cluster and on a phone). This module knows neither the
pipeline nor the mesh: the orchestrator hands in `DashboardSource`, a callable returning the
JSON-ready snapshot (app/coordination/pipeline/dashboard_feed.py builds it). Without one, the
page still shows this node's daemons and readiness.
"""

from __future__ import annotations

import time
from importlib import resources
from typing import Any, Callable

from aiohttp import web

DashboardSource = Callable[[], dict[str, Any]]
PAGE = "dashboard.html"


def _page() -> bytes:
    return resources.files("app.coordination.daemons").joinpath("static", PAGE).read_bytes()


def dashboard_routes(local: Callable[[], dict[str, Any]], source: DashboardSource | None) -> list[web.RouteDef]:
    """`local()`: this node's daemons and readiness (always there); `source()`: the cluster
    snapshot. Both run on the event loop, so they must only read memory (the feed caches what
    it reads from disk)."""
    page = _page()  # read once: the page is static, its data comes from /dashboard.json

    async def index(_: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-cache"})

    async def data(_: web.Request) -> web.Response:
        snapshot: dict[str, Any] = {"now": time.time(), **local()}
        if source is not None:
            try:
                snapshot.update(source())
            except Exception as exc:  # noqa: BLE001 - the page shows the error instead of going blank
                snapshot["error"] = f"cluster view unavailable: {exc!r}"
        return web.json_response(snapshot, headers={"Cache-Control": "no-store"})

    return [web.get("/", index), web.get("/dashboard.json", data)]
