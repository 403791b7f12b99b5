"""Server side of anti-entropy replication: any ReplicatedStore, under /replica/<store>/.

Four signed endpoints, each bounded, so a peer can find what it lacks by comparing digests
of ranges top-down and never needs a node's full id list:

    GET  /replica/<store>/digest                           -> {"origins": {origin: [count, xor]}, "count"}
    POST /replica/<store>/digest {"origin", "prefix"}      -> {"digest", "children": 16 x [count, xor]}
    POST /replica/<store>/ids    {"origin", "prefix", "after", "limit"} -> {"ids": [...]}
    POST /replica/<store>/fetch  {"ids": [...]}            -> {"records", "deferred", "missing"}

Store work runs in a thread so the mesh's heartbeats never wait behind a disk read.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web

from app.coordination.p2p.auth import json_error
from app.coordination.p2p.server import BadRequest, parse_body
from app.coordination.sync.ranges import Digest, children
from app.coordination.sync.replica_store import ReplicatedStore
from app.coordination.sync.wire import (
    DEFAULT_FETCH_BYTES,
    RangeDigestQuery,
    RangeIdsQuery,
    ReplicaFetchRequest,
)

_STORE_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


def wire_digest(d: Digest) -> list:
    return [d[0], f"{d[1]:016x}"]


def parse_digest(w: tuple[int, str] | list) -> Digest:
    """A digest from the wire; ValueError when malformed."""
    count, x = w
    return int(count), int(x, 16)


def replica_routes(name: str, store: ReplicatedStore, max_fetch_bytes: int = DEFAULT_FETCH_BYTES) -> list[web.RouteDef]:
    """Routes for `node.add_routes(...)` (signed) serving `store` as /replica/<name>/."""
    if not _STORE_NAME.fullmatch(name):
        raise ValueError(f"store name {name!r}: lowercase letters, digits and _ only")

    async def top(_request: web.Request) -> web.Response:
        origins = await asyncio.to_thread(store.top_digests)
        total = sum(d[0] for d in origins.values())
        return web.json_response({"origins": {o: wire_digest(d) for o, d in origins.items()}, "count": total})

    async def ranges(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, RangeDigestQuery)
        except BadRequest as exc:
            return json_error(400, str(exc))

        def work() -> dict:
            return {"digest": wire_digest(store.digest(q.origin, q.prefix)),
                    "children": [wire_digest(store.digest(q.origin, c)) for c in children(q.prefix)]}

        return web.json_response(await asyncio.to_thread(work))

    async def ids(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, RangeIdsQuery)
        except BadRequest as exc:
            return json_error(400, str(exc))
        found = await asyncio.to_thread(store.ids, q.origin, q.prefix, q.after, q.limit)
        return web.json_response({"ids": found})

    async def fetch(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, ReplicaFetchRequest)
        except BadRequest as exc:
            return json_error(400, str(exc))
        parts, deferred, missing = await asyncio.to_thread(store.fetch_json, list(dict.fromkeys(q.ids)), max_fetch_bytes)
        text = ('{"records": [' + ",".join(parts) + "], "
                f'"deferred": {json.dumps(deferred)}, "missing": {json.dumps(missing)}}}')
        return web.Response(text=text, content_type="application/json")

    base = f"/replica/{name}"
    return [web.get(f"{base}/digest", top), web.post(f"{base}/digest", ranges),
            web.post(f"{base}/ids", ids), web.post(f"{base}/fetch", fetch)]
