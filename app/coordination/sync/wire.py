"""Wire formats and bounds of the data plane, shared by its servers and clients.

The bounds live here, in one place, because both ends must agree on them: a client that asks
for more than a server accepts gets a 400, never a silently shortened answer.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

MAX_MANIFEST_LIMIT = 5000  # manifest entries per request
MAX_FETCH_UIDS = 256  # games asked for per fetch request
DEFAULT_FETCH_BYTES = 4 * 1024 * 1024  # games' JSON per fetch answer (beyond it: deferred)
MAX_UID_LEN = 64  # the replay DB's uid column

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")

Uid = Annotated[str, Field(min_length=1, max_length=MAX_UID_LEN)]


def is_sha256(value: str) -> bool:
    """A model's identity is exactly 64 lowercase hex digits; anything else never names a file."""
    return bool(SHA256_RE.fullmatch(value))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ManifestQuery(_Strict):
    """Query of GET /games/manifest: rows with id > after, oldest first."""

    after: int = Field(default=0, ge=0)
    limit: int = Field(default=1000, ge=1, le=MAX_MANIFEST_LIMIT)


class Manifest(BaseModel):
    """Answer of GET /games/manifest. `first` is the uid of the peer's oldest row: a cursor
    saved against another `first` belongs to a replaced DB and must start over."""

    entries: list[tuple[int, str]]
    max_id: int = Field(ge=0)
    first: str | None = None


class FetchRequest(_Strict):
    """Body of POST /games/fetch."""

    uids: list[Uid] = Field(min_length=1, max_length=MAX_FETCH_UIDS)


class FetchAnswer(BaseModel):
    """Answer of POST /games/fetch: the games that fit the byte budget; `deferred` did not fit
    (ask again), `missing` are not stored on that peer."""

    games: list[dict[str, Any]]
    deferred: list[str] = []
    missing: list[str] = []


# -- anti-entropy replication (replica_server.py, replication.py) --------------------------------
MAX_ORIGIN_LEN = 128
MAX_PREFIX_LEN = 6  # ranges.MAX_DEPTH
MAX_IDS_LIMIT = 5000

Origin = Annotated[str, Field(max_length=MAX_ORIGIN_LEN)]
Prefix = Annotated[str, Field(max_length=MAX_PREFIX_LEN, pattern=r"^[0-9a-f]*$")]
WireDigest = tuple[int, str]  # (count, XOR of the ids' hashes as 16 hex digits)


class RangeDigestQuery(_Strict):
    """Body of POST /replica/<store>/digest: the 16 children of one range of one origin."""

    origin: Origin
    prefix: Prefix = ""


class RangeDigests(BaseModel):
    digest: WireDigest
    children: list[WireDigest] = Field(min_length=16, max_length=16)


class TopDigests(BaseModel):
    """Answer of GET /replica/<store>/digest: every origin's whole-space digest."""

    origins: dict[str, WireDigest]
    count: int = Field(ge=0)


class RangeIdsQuery(_Strict):
    """Body of POST /replica/<store>/ids: origin's ids in a range, after `after`, ascending."""

    origin: Origin
    prefix: Prefix = ""
    after: Annotated[str, Field(max_length=MAX_UID_LEN)] = ""
    limit: int = Field(default=1000, ge=1, le=MAX_IDS_LIMIT)


class RangeIds(BaseModel):
    ids: list[Uid]


class ReplicaFetchRequest(_Strict):
    """Body of POST /replica/<store>/fetch."""

    ids: list[Uid] = Field(min_length=1, max_length=MAX_FETCH_UIDS)


class ReplicaFetchAnswer(BaseModel):
    records: list[dict[str, Any]]
    deferred: list[str] = []
    missing: list[str] = []


class ReplicaPushRequest(_Strict):
    """Body of POST /replica/<store>/push: records their origin (the sender) just made."""

    records: list[dict[str, Any]] = Field(min_length=1, max_length=MAX_FETCH_UIDS)


class ReplicaPushAnswer(BaseModel):
    """The pushed ids the receiver now holds (stored now, or already)."""

    stored: int = Field(ge=0)
    held: list[Uid] = Field(max_length=MAX_FETCH_UIDS)
