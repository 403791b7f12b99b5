"""LM models over the mesh: a promoted model is a Hugging Face checkpoint directory named by
the sha256 of its manifest (app/lm/model_dir.py), served and fetched by the same
manifest-directory machinery as datasets (dataset_server.py, dataset_fetch.py):

    GET /lm_models/<sha256>/manifest        manifest.json, byte for byte (its sha256 is the id)
    GET /lm_models/<sha256>/files/<name>    one file the manifest lists

The fetcher checks the manifest's hash, streams each file into a staging directory while
hashing it against the manifest, and renames the directory to `<models_root>/<sha256>/` only
when every byte checked out; a corrupt copy is named in the error and the next peer asked.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from aiohttp import web

from app.coordination.p2p.client import MeshClient
from app.coordination.sync.dataset_fetch import DEFAULT_MAX_FILE_BYTES, fetch_manifest_dir
from app.coordination.sync.dataset_server import dataset_routes
from app.coordination.sync.streaming import FetchError
from app.lm.model_dir import ModelDirError, read_model_manifest, verify_model_dir

ROUTE = "/lm_models"


class LMModelFetchError(FetchError):
    """No peer served a verified copy; names the sha256 and every peer's failure."""

    def __init__(self, sha256: str, failures: dict[str, str]) -> None:
        super().__init__("lm model", sha256, failures, "no peer to ask")


def lm_model_routes(models_root: str | Path) -> list[web.RouteDef]:
    """Routes for `node.add_routes(...)` (signed) serving `<models_root>/<sha256>/` directories."""
    return dataset_routes(models_root, route=ROUTE, what="lm model", reader=read_model_manifest)


async def fetch_lm_model(client: MeshClient, sha256: str, peer_addrs: list[str], models_root: str | Path, *,
                         timeout: float = 10.0, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES) -> Path:
    """The installed directory of model `sha256`, from the first peer with a verified copy
    (no peer is asked when a verified copy is already installed)."""
    path, failures = await fetch_manifest_dir(client, sha256, peer_addrs, models_root, what="lm model", route=ROUTE,
                                              verify=verify_model_dir, timeout=timeout,
                                              max_file_bytes=max_file_bytes)
    if path is None:
        raise LMModelFetchError(sha256, failures)
    try:
        read_model_manifest(path)  # the bytes were ours to check; the kind is the reader's
    except ModelDirError as exc:
        shutil.rmtree(path, ignore_errors=True)
        raise LMModelFetchError(sha256, {"(installed copy)": str(exc)}) from None
    return path
