"""Client side of game sync: pull the games a peer has and this node lacks.

Resumable and idempotent by construction, so a game arrives exactly once whatever fails:

- the peer's manifest is paged from a per-peer cursor, "every row of that peer up to id N is
  stored here", persisted atomically in `<state_dir>/<peer_id>.json`;
- only uids the local DB lacks are fetched, and the DB is idempotent by uid anyway;
- the cursor moves only after the batch below it is stored, so a failure between "stored" and
  "cursor saved" re-fetches at most one batch, which the DB then skips; a failure anywhere
  else resumes exactly where it stopped.

A cursor also remembers the uid of the peer's oldest row; a peer whose DB was replaced (other
oldest row, or fewer rows than the cursor) is synced again from the start.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import aiohttp
from pydantic import ValidationError

from app.atomic_files import atomic_write_json
from app.coordination.p2p.client import MeshClient
from app.coordination.sync.wire import MAX_FETCH_UIDS, MAX_MANIFEST_LIMIT, MAX_UID_LEN, FetchAnswer, Manifest
from app.db.replay_db import GameRecord, GameRow, ReplayDB
from app.log import get_logger

if TYPE_CHECKING:
    from app.coordination.p2p.node import MeshNode

log = get_logger(__name__)
_PEER_ID = re.compile(r"^[A-Za-z0-9_\-][A-Za-z0-9_.\-]{0,127}$")
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, OSError)


class SyncError(RuntimeError):
    """A pull from one peer failed (unreachable, refused, malformed answer); names the peer.
    Whatever was stored before it stays stored and the cursor says so."""


@dataclass(frozen=True)
class SyncReport:
    peer: str
    new: int = 0  # games inserted here
    skipped: int = 0  # uids this node already had
    missing: int = 0  # listed by the peer's manifest but no longer served by it
    cursor: int = 0  # the peer row id up to which everything is stored here
    complete: bool = True  # False: stopped early (time budget or error); the next pull resumes
    error: str | None = None


class PeerCursor:
    """One peer's sync position, in a small JSON file replaced atomically."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    @classmethod
    def for_peer(cls, state_dir: str | Path, peer_id: str) -> "PeerCursor":
        if not _PEER_ID.fullmatch(peer_id):
            raise ValueError(f"peer id {peer_id!r} cannot name a cursor file")
        return cls(Path(state_dir) / f"{peer_id}.json")

    def load(self) -> tuple[int, str | None]:
        """(row id, uid of the peer's oldest row); (0, None) when missing or unreadable, which
        costs a full re-sync of that peer but never a duplicate."""
        try:
            data = json.loads(self.path.read_text())
            after, first = int(data["after"]), data.get("first")
            if after < 0 or (first is not None and not isinstance(first, str)):
                raise ValueError("out of range")
            return after, first
        except FileNotFoundError:
            return 0, None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("unreadable sync cursor; syncing that peer from the start", path=str(self.path), error=str(exc))
            return 0, None

    def save(self, after: int, first: str | None) -> None:
        atomic_write_json(self.path, {"after": after, "first": first, "updated_at": time.time()})


def stored_uids(db: ReplayDB, uids: list[str]) -> set[str]:
    """Which of `uids` the DB already holds (one indexed query)."""
    from sqlalchemy import select
    from sqlalchemy.orm import Session

    with Session(db.engine) as session:
        return set(session.scalars(select(GameRow.uid).where(GameRow.uid.in_(uids))))


def parse_game(data: Any) -> GameRecord:
    """A game from a peer, checked enough that the DB can store it; ValueError otherwise."""
    try:
        record = GameRecord.from_json(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"malformed game: {exc!r}") from None
    if not record.uid or len(record.uid) > MAX_UID_LEN:
        raise ValueError(f"malformed game: bad uid {record.uid!r}")
    if record.winner not in (0, 1, None) or isinstance(record.winner, bool):
        raise ValueError(f"malformed game {record.uid}: winner {record.winner!r}")
    return record


class _Pull:
    """One pull from one peer; the counters become the SyncReport."""

    def __init__(self, client: MeshClient, addr: str, db: ReplayDB, cursor: PeerCursor,
                 page_size: int, fetch_batch: int, timeout: float, deadline: float | None) -> None:
        self.client, self.addr, self.db, self.cursor = client, addr, db, cursor
        self.page_size, self.fetch_batch, self.timeout, self.deadline = page_size, fetch_batch, timeout, deadline
        self.new = self.skipped = self.missing = 0
        self.after, self.first = cursor.load()

    def report(self, complete: bool) -> SyncReport:
        return SyncReport(self.addr, self.new, self.skipped, self.missing, self.after, complete)

    def out_of_time(self) -> bool:
        return self.deadline is not None and time.monotonic() >= self.deadline

    def advance(self, row_id: int) -> None:
        self.after = row_id
        self.cursor.save(self.after, self.first)

    async def run(self) -> SyncReport:
        resets = 0
        while True:
            if self.out_of_time():
                return self.report(complete=False)
            m = await self.manifest()
            if (self.first is not None and m.first != self.first) or m.max_id < self.after:
                resets += 1
                if resets > 2:
                    raise SyncError(f"{self.addr}: peer's replay DB keeps changing identity; giving up this round")
                log.warning("peer replay DB was replaced; syncing it from the start",
                            peer=self.addr, cursor=self.after, peer_max_id=m.max_id)
                self.first = m.first
                self.advance(0)
                continue
            self.first = m.first
            if not m.entries:
                return self.report(complete=True)
            if not await self.store_page(m.entries):
                return self.report(complete=False)
            if len(m.entries) < self.page_size:
                return self.report(complete=True)

    async def store_page(self, entries: list[tuple[int, str]]) -> bool:
        """Fetch and store one manifest page batch by batch; False when time ran out."""
        last = self.after
        for row_id, uid in entries:
            if row_id <= last or not uid or len(uid) > MAX_UID_LEN:
                raise SyncError(f"{self.addr}: malformed manifest entry [{row_id}, {uid!r}] after row {last}")
            last = row_id
        have = await asyncio.to_thread(stored_uids, self.db, [u for _, u in entries])
        self.skipped += sum(1 for _, u in entries if u in have)
        batch: list[str] = []
        for i, (row_id, uid) in enumerate(entries):
            if uid not in have:
                batch.append(uid)
            if len(batch) >= self.fetch_batch and i < len(entries) - 1:
                await self.fetch_and_store(batch)
                batch = []
                self.advance(row_id)
                if self.out_of_time():
                    return False
        if batch:
            await self.fetch_and_store(batch)
        self.advance(entries[-1][0])
        return True

    async def fetch_and_store(self, uids: list[str]) -> None:
        wanted = list(dict.fromkeys(uids))
        while wanted:
            answer = await self.fetch(wanted)
            asked = set(wanted)
            try:  # a page of games is checked off the event loop, as it is stored
                records = await asyncio.to_thread(lambda: [parse_game(g) for g in answer.games])
            except ValueError as exc:
                raise SyncError(f"{self.addr}: {exc}") from None
            strays = [r.uid for r in records if r.uid not in asked]
            if strays:
                raise SyncError(f"{self.addr}: sent games it was not asked for: {strays[:3]}")
            added = await asyncio.to_thread(self.db.add_games, records)
            self.new += added
            self.skipped += len(records) - added
            gone = [u for u in answer.missing if u in asked]
            if gone:
                self.missing += len(gone)
                log.warning("peer no longer has games its manifest listed", peer=self.addr, count=len(gone))
            done = {r.uid for r in records} | set(gone)
            rest = [u for u in wanted if u not in done]
            if len(rest) == len(wanted):
                raise SyncError(f"{self.addr}: fetch of {len(wanted)} games made no progress")
            wanted = rest

    async def call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            status, data = await self.client.request(method, self.addr, path, body, timeout=self.timeout)
        except _TRANSPORT_ERRORS as exc:
            raise SyncError(f"{self.addr}: {method} {path.split('?')[0]} failed: {exc!r}") from None
        if status != 200:
            why = data.get("error") if isinstance(data, dict) else str(data)[:200]
            raise SyncError(f"{self.addr}: {method} {path.split('?')[0]} answered HTTP {status}: {why}")
        return data

    async def manifest(self) -> Manifest:
        data = await self.call("GET", f"/games/manifest?after={self.after}&limit={self.page_size}")
        try:
            return Manifest.model_validate(data)
        except ValidationError as exc:
            raise SyncError(f"{self.addr}: malformed manifest: {exc.errors()[:2]}") from None

    async def fetch(self, uids: list[str]) -> FetchAnswer:
        data = await self.call("POST", "/games/fetch", {"uids": uids})
        try:
            return await asyncio.to_thread(FetchAnswer.model_validate, data)
        except ValidationError as exc:
            raise SyncError(f"{self.addr}: malformed fetch answer: {exc.errors()[:2]}") from None


async def pull_games(
    client: MeshClient,
    peer_addr: str,
    db: ReplayDB | str | Path,
    cursor: PeerCursor,
    *,
    page_size: int = 1000,
    fetch_batch: int = 128,
    timeout: float = 10.0,
    deadline: float | None = None,
) -> SyncReport:
    """Pull every game of `peer_addr` that `db` lacks, from `cursor` on; raises SyncError.

    `deadline` (time.monotonic()) is checked between batches, so the pull overruns it by at
    most one request (bounded by `timeout`); what was stored by then is kept and recorded.
    """
    if not 1 <= page_size <= MAX_MANIFEST_LIMIT:
        raise ValueError(f"page_size must be in 1..{MAX_MANIFEST_LIMIT}")
    if not 1 <= fetch_batch <= MAX_FETCH_UIDS:
        raise ValueError(f"fetch_batch must be in 1..{MAX_FETCH_UIDS}")
    rdb = db if isinstance(db, ReplayDB) else await asyncio.to_thread(ReplayDB, db)
    try:
        report = await _Pull(client, peer_addr, rdb, cursor, page_size, fetch_batch, timeout, deadline).run()
    finally:
        if rdb is not db:
            rdb.close()
    if report.new:
        log.info("pulled games", peer=peer_addr, new=report.new, skipped=report.skipped, cursor=report.cursor)
    return report


async def sync_from_peers(
    node: "MeshNode",
    db_path: str | Path,
    state_dir: str | Path,
    *,
    budget_s: float = 30.0,
    page_size: int = 1000,
    fetch_batch: int = 128,
    timeout: float = 10.0,
) -> list[SyncReport]:
    """One sync round: pull from every ALIVE peer (random order, so a slow peer cannot starve
    the rest round after round) until `budget_s` is spent. A failing peer is logged and
    reported with `error`; the others still sync. Local DB errors (ReplayDBError) propagate."""
    deadline = time.monotonic() + budget_s
    view = node.cluster_view()
    peers = [s.node_id for s in view.alive() if s.node_id != view.self_id]
    random.shuffle(peers)
    reports: list[SyncReport] = []
    db = await asyncio.to_thread(ReplayDB, db_path)
    try:
        for peer_id in peers:
            addr = node.addr_of(peer_id)
            if not addr:
                continue
            cursor = PeerCursor.for_peer(state_dir, peer_id)
            if time.monotonic() >= deadline:
                reports.append(SyncReport(addr, cursor=cursor.load()[0], complete=False, error="time budget spent"))
                continue
            try:
                reports.append(await pull_games(
                    node.client, addr, db, cursor, page_size=page_size, fetch_batch=fetch_batch,
                    timeout=timeout, deadline=deadline,
                ))
            except SyncError as exc:
                log.warning("game sync from peer failed", peer=peer_id, error=str(exc))
                reports.append(SyncReport(addr, cursor=cursor.load()[0], complete=False, error=str(exc)))
    finally:
        db.close()
    return reports
