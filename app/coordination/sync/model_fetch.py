"""Client side of model distribution: fetch a model by sha256 from whichever peer has a good copy.

Each peer is tried in turn: its sidecar must name the sha256 asked for, and its weights are
streamed into a private temp directory inside the models dir while being hashed. Only bytes
that hash to the sha256 are renamed into the model store (`model_store.install_staged`). A corrupt,
truncated or stalled download is deleted and the next peer tried; nothing partial ever sits
under the final name, so self-play can never pick it up.

Renaming out of a temp dir in the same directory (rather than calling `install_model`, which
copies) keeps a large download from being written twice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from app.games.search.model_meta import ModelFormatError, read_meta, sidecar_path
from app.coordination.p2p.client import MeshClient
from app.coordination.sync.model_store import install_staged, is_installed, model_file
from app.coordination.sync.streaming import FetchError, PeerFailed, download, first_verified_copy
from app.coordination.sync.wire import is_sha256
from app.log import get_logger

if TYPE_CHECKING:
    from app.coordination.p2p.node import ClusterView, MeshNode

log = get_logger(__name__)
DEFAULT_MAX_MODEL_BYTES = 4 << 30  # a peer cannot fill our disk with an endless "model"


class ModelFetchError(FetchError):
    """No peer served a verified copy; the message names the sha256 and every peer's failure."""

    def __init__(self, sha256: str, failures: dict[str, str]) -> None:
        super().__init__("model", sha256, failures, "no peer has it")


def peers_with_model(
    view: "ClusterView", sha256: str, addr_of: Callable[[str], str | None] | None = None
) -> list[str]:
    """Addresses of ALIVE peers (not this node) whose gossiped inventory lists the model.
    `addr_of` (e.g. `node.addr_of`) overrides gossiped addresses, e.g. pinned ones."""
    addrs = []
    for state in sorted(view.alive(), key=lambda s: s.node_id):
        if state.node_id == view.self_id:
            continue
        models = state.inventory.get("models")
        if not isinstance(models, list) or sha256 not in models:
            continue
        addr = (addr_of(state.node_id) if addr_of else None) or state.addr
        if addr:
            addrs.append(addr)
    return addrs


async def fetch_model(
    client: MeshClient,
    sha256: str,
    peer_addrs: list[str],
    models_dir: str | Path,
    *,
    timeout: float = 10.0,
    max_bytes: int = DEFAULT_MAX_MODEL_BYTES,
) -> Path:
    """The installed path of model `sha256`, fetched from the first peer with a verified copy.

    `timeout` bounds the connection and each read (a stalled peer), not the whole transfer,
    so a large model on a slow link still arrives. Raises ModelFetchError when no peer works.
    """
    if not is_sha256(sha256):
        raise ValueError(f"{sha256!r} is not a sha256 (64 lowercase hex digits)")
    models_dir = Path(models_dir)
    if await asyncio.to_thread(is_installed, models_dir, sha256):
        return model_file(models_dir, sha256)
    models_dir.mkdir(parents=True, exist_ok=True)

    async def fetch(session: aiohttp.ClientSession, addr: str, staging: Path) -> Path:
        return await _fetch_from(client, session, addr, sha256, staging, models_dir, timeout, max_bytes)

    path, failures = await first_verified_copy("model", sha256, peer_addrs, models_dir, timeout, fetch, client)
    if path is not None:
        return path
    raise ModelFetchError(sha256, failures)


async def _fetch_from(
    client: MeshClient, session: aiohttp.ClientSession, addr: str, sha256: str,
    staging: Path, models_dir: Path, timeout: float, max_bytes: int,
) -> Path:
    status, meta = await client.request("GET", addr, f"/models/{sha256}/meta", timeout=timeout)
    if status != 200 or not isinstance(meta, dict):
        why = meta.get("error") if isinstance(meta, dict) else str(meta)[:200]
        raise PeerFailed(f"meta: HTTP {status}: {why}")
    if meta.get("sha256") != sha256:
        raise PeerFailed(f"its sidecar names {str(meta.get('sha256'))[:16]!r}, not this model")
    weights = staging / f"{sha256}.safetensors"
    side = sidecar_path(weights)
    side.write_text(json.dumps(meta, indent=2, sort_keys=True))
    try:
        read_meta(weights)  # the sidecar must be one this program can read, or it is not installed
    except ModelFormatError as exc:
        raise PeerFailed(f"bad sidecar: {exc}") from None

    size, actual = await download(client, session, addr, f"/models/{sha256}", weights, max_bytes, "weights")
    if actual != sha256:
        raise PeerFailed(f"weights corrupt: {size} bytes hash to {actual[:16]}")
    return await asyncio.to_thread(install_staged, weights, models_dir, sha256)


async def fetch_from_mesh(node: "MeshNode", sha256: str, models_dir: str | Path, **kwargs: object) -> Path:
    """fetch_model from the ALIVE peers whose gossiped inventory lists the model."""
    peers = peers_with_model(node.cluster_view(), sha256, node.addr_of)
    return await fetch_model(node.client, sha256, peers, models_dir, **kwargs)  # type: ignore[arg-type]
