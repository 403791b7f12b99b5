"""Server side of model distribution: a node serves the models in its store by sha256.

    GET /models/<sha256>        the weights, streamed from disk (never read whole into memory)
    GET /models/<sha256>/meta   the sidecar JSON

Signed like every node-to-node call. The sha256 must be 64 lowercase hex digits (400 otherwise),
which also means a path can never leave the models directory. A weights file without its
sidecar is an unfinished install and is not served (404). The server does not re-hash what it
serves: the fetcher verifies every byte, so a corrupt copy here costs a retry elsewhere, never
a bad model there.
"""

from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from app.games.search.model_meta import sidecar_path
from app.coordination.p2p.auth import json_error
from app.coordination.sync.model_store import is_present, model_file
from app.coordination.sync.wire import is_sha256


def model_routes(models_dir: str | Path) -> list[web.RouteDef]:
    """Routes for `node.add_routes(...)` (signed, not public)."""
    root = Path(models_dir)

    def locate(request: web.Request) -> tuple[Path | None, web.Response | None]:
        sha = request.match_info["sha256"]
        if not is_sha256(sha):
            return None, json_error(400, "model id must be a sha256: 64 lowercase hex digits")
        if not is_present(root, sha):
            return None, json_error(404, f"model {sha} is not in this node's store")
        return model_file(root, sha), None

    async def weights(request: web.Request) -> web.StreamResponse:
        path, error = locate(request)
        if error is not None:
            return error
        assert path is not None
        return web.FileResponse(path, headers={"Content-Type": "application/octet-stream"})

    async def meta(request: web.Request) -> web.Response:
        path, error = locate(request)
        if error is not None:
            return error
        assert path is not None
        try:
            data = json.loads(sidecar_path(path).read_text())
        except (OSError, ValueError):
            return json_error(404, f"model {request.match_info['sha256']}: sidecar unreadable on this node")
        return web.json_response(data)

    return [web.get("/models/{sha256}", weights), web.get("/models/{sha256}/meta", meta)]
