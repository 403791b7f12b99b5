"""Server side of anti-entropy replication: any ReplicatedStore, under /replica/<store>/.

Five signed endpoints, each bounded: four so a peer can find what it lacks by comparing
digests of ranges top-down and never needs a node's full id list, and one the origin of new
records pushes them to (replica_push.py), accepted only from that origin:

    GET  /replica/<store>/digest                           -> {"origins": {origin: [count, xor]}, "count"}
    POST /replica/<store>/digest {"origin", "prefix"}      -> {"digest", "children": 16 x [count, xor]}
    POST /replica/<store>/ids    {"origin", "prefix", "after", "limit"} -> {"ids": [...]}
    POST /replica/<store>/fetch  {"ids": [...]}            -> {"records", "deferred", "missing"}
    POST /replica/<store>/push   {"records": [...]}        -> {"stored", "held"}

Store work runs in a thread so the mesh's heartbeats never wait behind a disk read.
"""

from __future__ import annotations

import asyncio
import json
import re

from aiohttp import web

from app.coordination.p2p.auth import json_error
from app.coordination.p2p.jsonwire import dumps
from app.coordination.p2p.server import BadRequest, parse_body, sender_of
from app.coordination.sync.ranges import Digest, children
from app.coordination.sync.replica_store import ReplicatedStore
from app.coordination.sync.wire import (
    DEFAULT_FETCH_BYTES,
    RangeDigestQuery,
    RangeIdsQuery,
    ReplicaFetchRequest,
    ReplicaPushRequest,
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
        return web.json_response({"origins": {o: wire_digest(d) for o, d in origins.items()}, "count": total},
                                 dumps=dumps)

    async def ranges(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, RangeDigestQuery)
        except BadRequest as exc:
            return json_error(400, str(exc))

        def work() -> dict:
            return {"digest": wire_digest(store.digest(q.origin, q.prefix)),
                    "children": [wire_digest(store.digest(q.origin, c)) for c in children(q.prefix)]}

        return web.json_response(await asyncio.to_thread(work), dumps=dumps)

    async def ids(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, RangeIdsQuery)
        except BadRequest as exc:
            return json_error(400, str(exc))
        found = await asyncio.to_thread(store.ids, q.origin, q.prefix, q.after, q.limit)
        return web.json_response({"ids": found}, dumps=dumps)

    async def fetch(request: web.Request) -> web.Response:
        try:
            q = parse_body(request, ReplicaFetchRequest)
        except BadRequest as exc:
            return json_error(400, str(exc))
        parts, deferred, missing = await asyncio.to_thread(store.fetch_json, list(dict.fromkeys(q.ids)), max_fetch_bytes)
        text = ('{"records": [' + ",".join(parts) + "], "
                f'"deferred": {json.dumps(deferred)}, "missing": {json.dumps(missing)}}}')
        return web.Response(text=text, content_type="application/json")

    async def push(request: web.Request) -> web.Response:
        """Records their origin just made: a node speaks for its own records only."""
        try:  # a batch of records is parsed off the event loop (its heartbeats must not wait)
            q = await asyncio.to_thread(parse_body, request, ReplicaPushRequest)
        except BadRequest as exc:
            return json_error(400, str(exc))
        sender = sender_of(request)
        strangers = [r.get("uid") for r in q.records if r.get("node_id") != sender]
        if strangers:
            return json_error(400, f"records of another origin than {sender}: {strangers[:3]}; "
                                   "only a record's origin pushes it (others are pulled)")
        try:
            stored = await asyncio.to_thread(store.insert, q.records)
        except ValueError as exc:
            return json_error(400, f"refused records: {str(exc)[:300]}")
        return web.json_response({"stored": stored, "held": [str(r["uid"]) for r in q.records]}, dumps=dumps)

    base = f"/replica/{name}"
    return [web.get(f"{base}/digest", top), web.post(f"{base}/digest", ranges),
            web.post(f"{base}/ids", ids), web.post(f"{base}/fetch", fetch), web.post(f"{base}/push", push)]
