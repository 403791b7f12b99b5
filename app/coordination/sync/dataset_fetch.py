"""Client side of dataset transfer: fetch a dataset by its sha256 from a peer that has it.

A joiner of a spanned training run must train on exactly the claimant's data. The manifest
is fetched first and must hash to the sha256 asked for; then each file it lists is streamed
into a private staging directory inside the datasets dir while being hashed, and must match
the manifest's sha256 and size. Only a dataset whose every byte checked out is renamed into
`<datasets_dir>/<sha256>/`; a corrupt or truncated copy is deleted, named in the error (peer,
file, expected sha256), and the next peer tried. Nothing partial ever sits under the final name.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
from collections.abc import Callable
from pathlib import Path

import aiohttp

from app.atomic_files import replace_dir
from app.coordination.p2p.client import MeshClient
from app.coordination.sync.streaming import CHUNK, FetchError, PeerFailed, download, first_verified_copy
from app.coordination.sync.wire import is_sha256
from app.log import get_logger
from app.shared.manifests import MANIFEST_NAME, verify_dir
from app.games.train.dataset import read_manifest

log = get_logger(__name__)
MAX_MANIFEST_BYTES = 1 << 20
DEFAULT_MAX_FILE_BYTES = 8 << 30
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # a plain name: no path, no hidden file


class DatasetFetchError(FetchError):
    """No peer served a verified copy; names the sha256 and every peer's failure."""

    def __init__(self, sha256: str, failures: dict[str, str]) -> None:
        super().__init__("dataset", sha256, failures, "no peer to ask")


def installed_dataset(datasets_dir: str | Path, sha256: str) -> Path:
    return Path(datasets_dir) / sha256


def verify_dataset(path: Path, sha256: str) -> str | None:
    """The one manifest check (app/shared/manifests.verify_dir) with the NPZ dataset's reader."""
    return verify_dir(path, sha256, read_manifest)


async def fetch_dataset(
    client: MeshClient, sha256: str, peer_addrs: list[str], datasets_dir: str | Path, *,
    timeout: float = 10.0, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> Path:
    """The installed path of dataset `sha256`, fetched from the first peer with a verified copy.
    `timeout` bounds connecting and each read, not the whole transfer."""
    path, failures = await fetch_manifest_dir(client, sha256, peer_addrs, datasets_dir, what="dataset",
                                              route="/datasets", verify=verify_dataset, timeout=timeout,
                                              max_file_bytes=max_file_bytes)
    if path is not None:
        return path
    raise DatasetFetchError(sha256, failures)


async def fetch_manifest_dir(
    client: MeshClient, sha256: str, peer_addrs: list[str], root: str | Path, *, what: str, route: str,
    verify: Callable[[Path, str], str | None], timeout: float = 10.0, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
) -> tuple[Path | None, dict[str, str]]:
    """Any directory named by the sha256 of its manifest (a dataset, an LM checkpoint) served
    under `<route>/<sha256>/`, installed as `<root>/<sha256>/`: (path, {}) or (None, every
    peer's failure). `verify(path, sha256)` checks a copy already installed."""
    if not is_sha256(sha256):
        raise ValueError(f"{sha256!r} is not a sha256 (64 lowercase hex digits)")
    root = Path(root)
    final = root / sha256
    if final.is_dir() and await asyncio.to_thread(verify, final, sha256) is None:
        return final, {}
    root.mkdir(parents=True, exist_ok=True)

    async def fetch(session: aiohttp.ClientSession, addr: str, staging: Path) -> Path:
        await _fetch_into(client, session, addr, f"{route}/{sha256}", sha256, staging, max_file_bytes)
        await asyncio.to_thread(replace_dir, staging, final)  # a bad copy there is moved aside
        return final

    return await first_verified_copy(what, sha256, peer_addrs, root, timeout, fetch, client)


async def _fetch_into(client: MeshClient, session: aiohttp.ClientSession, addr: str, base: str, sha256: str,
                      staging: Path, max_file_bytes: int) -> None:
    raw = await _get(client, session, addr, f"{base}/manifest", MAX_MANIFEST_BYTES)
    actual = hashlib.sha256(raw).hexdigest()
    if actual != sha256:
        raise PeerFailed(f"manifest hashes to {actual[:16]}, not the one asked for")
    try:
        manifest = json.loads(raw)
        files = manifest["files"]
        entries = [(str(name), str(e["sha256"]), int(e["bytes"])) for name, e in files.items()]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise PeerFailed(f"manifest unusable: {exc!r}") from None
    for name, _, _ in entries:
        if not _FILE_NAME.fullmatch(name) or name == MANIFEST_NAME:
            raise PeerFailed(f"manifest lists a file name this node will not write: {name!r}")
    for name, want, size in entries:
        if size > max_file_bytes:
            raise PeerFailed(f"{name}: {size} bytes is over the {max_file_bytes} limit")
        got, digest = await download(client, session, addr, f"{base}/files/{name}", staging / name,
                                     size, name)
        if got != size or digest != want:
            raise PeerFailed(f"{name} corrupt: {got} bytes hash to {digest[:16]}, "
                              f"the manifest says {size} bytes with sha256 {want[:16]}")
    with open(staging / MANIFEST_NAME, "wb") as fh:  # last: a staging dir with a manifest is complete
        fh.write(raw)
        fh.flush()
        os.fsync(fh.fileno())


async def _get(client: MeshClient, session: aiohttp.ClientSession, addr: str, path: str, limit: int) -> bytes:
    async with session.get(client.url(addr, path), headers=await client.signed_headers(addr, "GET", path)) as resp:
        if resp.status != 200:
            raise PeerFailed(f"{path}: HTTP {resp.status}: {(await resp.text())[:200]}")
        data = bytearray()
        async for chunk in resp.content.iter_chunked(CHUNK):
            data += chunk
            if len(data) > limit:
                raise PeerFailed(f"{path}: more than {limit} bytes")
        return bytes(data)


