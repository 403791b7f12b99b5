"""Model distribution between real MeshNodes on loopback: a corrupt, truncated, cut-off or
mislabelled copy is rejected and the good copy from another peer installed; endpoint checks."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from app.games.search.model import Architecture, ModelMeta, file_sha256, load_model, new_model, save_model, sidecar_path
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.membership import Liveness
from app.coordination.p2p.node import ClusterView, MeshNode
from app.coordination.p2p.schemas import NodeState
from app.coordination.sync import ModelFetchError, fetch_model, installed_models, model_routes, peers_with_model
from tests.mesh_helpers import free_ports
from tests.sync_helpers import serving, signed_client

pytestmark = pytest.mark.timeout(60)
SECRET = b"model-sync-secret"
ARCH = Architecture(4, 1, (3, 6, 7), 7)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    path = tmp_path_factory.mktemp("src") / "model.safetensors"
    meta = save_model(new_model(ARCH, seed=3), ModelMeta(ARCH, "connect4", generation=1), path)
    assert meta.sha256 is not None
    return path, meta.sha256


def stock(models_dir: Path, model: tuple[Path, str], weights: bytes | None = None, sidecar: dict | None = None) -> None:
    """Put the model into a peer's store under its sha256, optionally with other bytes/sidecar."""
    src, sha = model
    models_dir.mkdir(parents=True, exist_ok=True)
    dest = models_dir / f"{sha}.safetensors"
    dest.write_bytes(src.read_bytes() if weights is None else weights)
    side = sidecar if sidecar is not None else json.loads(sidecar_path(src).read_text())
    sidecar_path(dest).write_text(json.dumps(side))


def cut_off_route(data: bytes) -> web.RouteDef:
    """A peer whose connection drops halfway through the weights."""
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        resp.content_length = len(data)
        await resp.prepare(request)
        await resp.write(data[: len(data) // 2])
        assert request.transport is not None
        request.transport.close()
        return resp
    return web.get("/models/{sha256}", handler)


@pytest.fixture
async def peers(tmp_path: Path, model: tuple[Path, str]):  # type: ignore[no-untyped-def]
    """Solo nodes named by what they serve: corrupt, truncated, cutoff, mislabelled, empty, good."""
    src, sha = model
    good = src.read_bytes()
    flipped = bytearray(good)
    flipped[len(flipped) // 2] ^= 0xFF
    side = json.loads(sidecar_path(src).read_text())
    stores = {name: tmp_path / name / "models" for name in
              ["corrupt", "truncated", "cutoff", "mislabelled", "empty", "good"]}
    stock(stores["corrupt"], model, weights=bytes(flipped))
    stock(stores["truncated"], model, weights=good[: len(good) // 3])
    stock(stores["cutoff"], model)
    stock(stores["mislabelled"], model, sidecar={**side, "sha256": "0" * 64})
    stores["empty"].mkdir(parents=True)
    stock(stores["good"], model)
    routes = {name: model_routes(store) for name, store in stores.items()}
    routes["cutoff"] = [cut_off_route(good), *[r for r in routes["cutoff"] if r.path.endswith("/meta")]]  # type: ignore[attr-defined]
    async with serving(tmp_path, routes, SECRET) as nodes:
        yield nodes


@pytest.fixture
async def client():  # type: ignore[no-untyped-def]
    async with signed_client(SECRET) as c:
        yield c


def leftovers(models_dir: Path) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir()) if models_dir.exists() else []


async def test_bad_copies_are_rejected_and_the_good_one_installed(
    tmp_path: Path, model: tuple[Path, str], peers: dict[str, MeshNode], client: MeshClient
) -> None:
    _, sha = model
    local = tmp_path / "local" / "models"
    order = ["corrupt", "truncated", "cutoff", "mislabelled", "empty", "good"]
    path = await fetch_model(client, sha, [peers[n].addr for n in order], local)
    assert path == local / f"{sha}.safetensors" and file_sha256(path) == sha
    assert leftovers(local) == [f"{sha}.json", f"{sha}.safetensors"]  # no staging dirs, no partials
    net, meta = load_model(path, expect_game="connect4", expect_arch=ARCH, expect_sha256=sha)
    assert meta.generation == 1 and installed_models(local) == [sha]

    # Installed and verified: no peer is asked at all.
    assert await fetch_model(client, sha, [], local) == path
    # A local copy that went bad is replaced by a verified one.
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    assert await fetch_model(client, sha, [peers["corrupt"].addr, peers["good"].addr], local) == path
    assert file_sha256(path) == sha


async def test_all_bad_raises_naming_the_sha_and_every_peer(
    tmp_path: Path, model: tuple[Path, str], peers: dict[str, MeshNode], client: MeshClient
) -> None:
    _, sha = model
    local = tmp_path / "local" / "models"
    dead = f"127.0.0.1:{free_ports(1)[0]}"
    names = ["corrupt", "truncated", "cutoff", "mislabelled", "empty"]
    addrs = [peers[n].addr for n in names] + [dead]
    with pytest.raises(ModelFetchError) as info:
        await fetch_model(client, sha, addrs, local, timeout=2.0)
    err = info.value
    assert sha in str(err) and set(err.failures) == set(addrs)
    assert "corrupt" in err.failures[peers["corrupt"].addr]
    assert "corrupt" in err.failures[peers["truncated"].addr]
    assert "transfer failed" in err.failures[peers["cutoff"].addr]
    assert "sidecar names" in err.failures[peers["mislabelled"].addr]
    assert "404" in err.failures[peers["empty"].addr]
    assert "transfer failed" in err.failures[dead]
    assert leftovers(local) == []  # nothing under the final name, no staging left behind
    with pytest.raises(ValueError, match="sha256"):
        await fetch_model(client, sha.upper(), addrs, local)


async def test_model_endpoints_validate_and_require_signatures(
    model: tuple[Path, str], peers: dict[str, MeshNode], client: MeshClient
) -> None:
    src, sha = model
    addr = peers["good"].addr
    status, meta = await client.request("GET", addr, f"/models/{sha}/meta")
    assert status == 200 and meta["sha256"] == sha and meta["game"] == "connect4"
    for bad in [sha.upper(), sha[:-1], "..%2F..%2Fetc", "x" * 64]:
        for suffix in ("", "/meta"):
            status, data = await client.request("GET", addr, f"/models/{bad}{suffix}")
            assert status == 400 and "sha256" in data["error"], (bad, suffix, data)
    status, data = await client.request("GET", addr, f"/models/{'1' * 64}")
    assert status == 404 and "not in this node's store" in data["error"]
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{addr}/models/{sha}") as r:
            assert r.status == 401
        async with s.get(f"http://{addr}/models/{sha}/meta") as r:
            assert r.status == 401


def test_peers_with_model_lists_alive_peers_that_have_it() -> None:
    sha, other = "a" * 64, "b" * 64
    states = {
        "me": NodeState(node_id="me", addr="h0:1", inventory={"models": [sha]}),
        "p1": NodeState(node_id="p1", addr="h1:1", inventory={"models": [other, sha]}),
        "p2": NodeState(node_id="p2", addr="h2:1", inventory={"models": [other]}),
        "p3": NodeState(node_id="p3", addr="h3:1", inventory={"models": [sha]}),
        "p4": NodeState(node_id="p4", addr="h4:1", inventory={"models": "junk"}),
        "p5": NodeState(node_id="p5", addr="h5:1", inventory={"models": [sha]}),
    }
    liveness = {"me": Liveness.ALIVE, "p1": Liveness.ALIVE, "p2": Liveness.ALIVE, "p3": Liveness.SUSPECT,
                "p4": Liveness.ALIVE, "p5": Liveness.ALIVE}
    view = ClusterView(self_id="me", term=1, leader="me", nodes=states, liveness=liveness)
    assert peers_with_model(view, sha) == ["h1:1", "h5:1"]
    assert peers_with_model(view, sha, addr_of=lambda nid: "pinned:9" if nid == "p5" else None) == ["h1:1", "pinned:9"]
    assert peers_with_model(view, "c" * 64) == []


def test_installed_models_ignores_partial_and_foreign_files(tmp_path: Path, model: tuple[Path, str]) -> None:
    _, sha = model
    stock(tmp_path, model)
    (tmp_path / f"{'d' * 64}.safetensors").write_bytes(b"weights without a sidecar")
    (tmp_path / "notes.safetensors").write_bytes(b"x")
    shutil.copy(tmp_path / f"{sha}.json", tmp_path / "notes.json")
    assert installed_models(tmp_path) == [sha]
    assert installed_models(tmp_path / "missing") == []
