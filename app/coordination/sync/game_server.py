"""Server side of game sync: a peer lists its games by row id and hands out games by uid.

Two signed endpoints, both bounded so that no request makes a node build an unbounded answer:

    GET  /games/manifest?after=<row id>&limit=<n>   -> {"entries": [[row_id, uid], ...], "max_id", "first"}
    POST /games/fetch {"uids": [...]}               -> {"games": [...], "deferred": [...], "missing": [...]}

and the anti-entropy endpoints of the same games as a ReplicatedStore, /replica/games/...
(replica_server.py: digests of id ranges, ids of a range, games by id).

Row ids are the peer's own insertion order, so a puller can remember "everything up to row N
is synced" as one number per peer. SQLite work runs in a thread so the mesh's heartbeats are
never stuck behind a disk read.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.coordination.p2p.auth import json_error
from app.coordination.p2p.server import BadRequest, parse_body
from app.coordination.sync.replica_server import replica_routes
from app.coordination.sync.replica_store import GameStore
from app.coordination.sync.wire import DEFAULT_FETCH_BYTES, FetchRequest, ManifestQuery
from app.db.engines import is_url
from app.db.replay_db import GameRow, ReplayDB


def _query_error(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:10])


class GameSyncServer:
    """Serves one node's replay DB to its peers; opens the DB on first use, keeps it open."""

    def __init__(self, db_path: str | Path, max_fetch_bytes: int = DEFAULT_FETCH_BYTES) -> None:
        self.db_path = db_path if is_url(db_path) else Path(db_path)  # a file, or a database URL
        self.max_fetch_bytes = max_fetch_bytes
        self._db: ReplayDB | None = None
        self._store: GameStore | None = None
        self._lock = threading.Lock()

    def db(self) -> ReplayDB:
        with self._lock:
            if self._db is None:
                self._db = ReplayDB(self.db_path)
            return self._db

    def store(self) -> GameStore:
        """The games as a ReplicatedStore (its range index lives as long as this server)."""
        db = self.db()
        with self._lock:
            if self._store is None:
                self._store = GameStore(db)
            return self._store

    def close(self) -> None:
        with self._lock:
            self._store = None
            if self._db is not None:
                self._db.close()
                self._db = None

    def routes(self) -> list[web.RouteDef]:
        return [web.get("/games/manifest", self.manifest), web.post("/games/fetch", self.fetch),
                *replica_routes("games", _LazyStore(self), self.max_fetch_bytes)]

    # -- handlers -------------------------------------------------------------------
    async def manifest(self, request: web.Request) -> web.Response:
        try:
            query = ManifestQuery.model_validate(dict(request.query))
        except ValidationError as exc:
            return json_error(400, f"invalid manifest query: {_query_error(exc)}")
        text = await asyncio.to_thread(self._manifest_json, query.after, query.limit)
        return web.Response(text=text, content_type="application/json")

    async def fetch(self, request: web.Request) -> web.Response:
        try:
            req = parse_body(request, FetchRequest)
        except BadRequest as exc:
            return json_error(400, str(exc))
        uids = list(dict.fromkeys(req.uids))  # a repeated uid is served once
        text = await asyncio.to_thread(self._fetch_json, uids)
        return web.Response(text=text, content_type="application/json")

    # -- DB work (in a thread) ------------------------------------------------------
    def _manifest_json(self, after: int, limit: int) -> str:
        db = self.db()
        with Session(db.engine) as session:
            rows = session.execute(
                select(GameRow.id, GameRow.uid).where(GameRow.id > after).order_by(GameRow.id).limit(limit)
            ).all()
            max_id = int(session.scalar(select(func.coalesce(func.max(GameRow.id), 0))) or 0)
            first = session.scalar(select(GameRow.uid).order_by(GameRow.id).limit(1))
        return json.dumps({"entries": [[int(i), u] for i, u in rows], "max_id": max_id, "first": first})

    def _fetch_json(self, uids: list[str]) -> str:
        """Games in row order until the byte budget is spent; the first game is always sent so
        that one oversized game cannot stall a sync forever."""
        parts: list[str] = []
        size = 0
        sent: set[str] = set()
        deferred: list[str] = []
        for record in self.db().iter_games(uids=uids):
            part = json.dumps(record.to_json())
            if parts and size + len(part) > self.max_fetch_bytes:
                deferred.append(record.uid)
                continue
            parts.append(part)
            size += len(part) + 1
            sent.add(record.uid)
        later = set(deferred)
        missing = [u for u in uids if u not in sent and u not in later]
        return (
            '{"games": [' + ",".join(parts) + "], "
            f'"deferred": {json.dumps(deferred)}, "missing": {json.dumps(missing)}}}'
        )


class _LazyStore:
    """The server's GameStore, opened on first use (the DB may not exist when routes are made)."""

    def __init__(self, server: GameSyncServer) -> None:
        self._server = server

    def __getattr__(self, name: str) -> Any:  # forwards the ReplicatedStore methods
        return getattr(self._server.store(), name)


def game_routes(db_path: str | Path, max_fetch_bytes: int = DEFAULT_FETCH_BYTES) -> list[web.RouteDef]:
    """Routes for `node.add_routes(...)` (signed). Use GameSyncServer directly to close the DB."""
    return GameSyncServer(db_path, max_fetch_bytes).routes()
