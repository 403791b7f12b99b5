"""Server side of dataset transfer: the claimant of a spanned training run serves the dataset
its joiners must train on, by the dataset's identity (the sha256 of its manifest).

    GET /datasets/<sha256>/manifest        manifest.json, byte for byte (its sha256 is the id)
    GET /datasets/<sha256>/files/<name>    one file the manifest lists, streamed from disk

Signed like every node-to-node call. A file is served only when the manifest lists its name,
so no path from a request ever reaches the filesystem unchecked. Like the model server, it
does not re-hash what it serves: the fetcher verifies every byte against the manifest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from app.coordination.p2p.auth import json_error
from app.coordination.sync.wire import is_sha256
from app.games.train.dataset import MANIFEST_NAME, read_manifest


ManifestReader = Callable[[Path], tuple[dict, str]]  # (manifest, its sha256); ValueError when unusable


def find_dataset(datasets_dir: Path, sha256: str, reader: ManifestReader = read_manifest) -> Path | None:
    """The dataset directory whose manifest hashes to `sha256` (hidden staging dirs skipped)."""
    if not datasets_dir.is_dir():
        return None
    for path in sorted(datasets_dir.iterdir()):
        if path.name.startswith(".") or not path.is_dir():
            continue
        try:
            _, sha = reader(path)
        except ValueError:  # DatasetError and the other readers' errors
            continue
        if sha == sha256:
            return path
    return None


def dataset_routes(datasets_dir: str | Path, *, route: str = "/datasets", what: str = "dataset",
                   reader: ManifestReader = read_manifest) -> list[web.RouteDef]:
    """Routes for `node.add_routes(...)` (signed, not public). The same routes serve any
    directory named by the sha256 of its manifest (`route`, `reader`): LM checkpoints too."""
    root = Path(datasets_dir)

    def locate(request: web.Request) -> tuple[Path | None, dict | None, web.Response | None]:
        sha = request.match_info["sha256"]
        if not is_sha256(sha):
            return None, None, json_error(400, f"{what} id must be a sha256: 64 lowercase hex digits")
        path = find_dataset(root, sha, reader)
        if path is None:
            return None, None, json_error(404, f"{what} {sha} is not on this node")
        manifest, _ = reader(path)
        return path, manifest, None

    async def manifest(request: web.Request) -> web.StreamResponse:
        path, _, error = locate(request)
        if error is not None:
            return error
        assert path is not None
        return web.FileResponse(path / MANIFEST_NAME, headers={"Content-Type": "application/json"})

    async def file(request: web.Request) -> web.StreamResponse:
        path, manifest, error = locate(request)
        if error is not None:
            return error
        assert path is not None and manifest is not None
        name = request.match_info["name"]
        files = manifest.get("files")
        if not isinstance(files, dict) or name not in files or not (path / name).is_file():
            return json_error(404, f"{what} {request.match_info['sha256']} has no file {name!r}")
        return web.FileResponse(path / name, headers={"Content-Type": "application/octet-stream"})

    return [web.get(route + "/{sha256}/manifest", manifest), web.get(route + "/{sha256}/files/{name}", file)]
