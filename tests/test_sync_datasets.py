"""Dataset transfer between real MeshNodes on loopback: a joiner of a spanned training run gets
the claimant's exact dataset by sha256; a corrupt copy is refused by name and nothing installed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from app.coordination.p2p.client import MeshClient
from app.coordination.sync.dataset_fetch import DatasetFetchError, fetch_dataset, verify_dataset
from app.coordination.sync.dataset_server import dataset_routes
from app.games.train.dataset import load_dataset
from app.games.train.export import export_dataset
from tests.mesh_helpers import refused_both_ways
from tests.train_fixtures import make_db
from tests.sync_helpers import serving, signed_client

pytestmark = pytest.mark.timeout(60)
SECRET = b"dataset-sync-secret"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("src")
    make_db(root / "games.db", 12)
    result = export_dataset([root / "games.db"], root / "datasets" / "gen_0001", augment=False)
    return root / "datasets", result.dataset_sha256


@pytest.fixture
async def servers(tmp_path: Path, source: tuple[Path, str]):  # type: ignore[no-untyped-def]
    """Two nodes serving the dataset: `good` as exported, `corrupt` with one byte of train.npz flipped."""
    datasets, _ = source
    corrupt = tmp_path / "corrupt" / "datasets"
    shutil.copytree(datasets, corrupt)
    npz = corrupt / "gen_0001" / "train.npz"
    data = bytearray(npz.read_bytes())
    data[len(data) // 2] ^= 0xFF
    npz.write_bytes(bytes(data))
    async with serving(tmp_path, {"good": dataset_routes(datasets), "corrupt": dataset_routes(corrupt)}, SECRET) as nodes:
        yield nodes


@pytest.fixture
async def client():  # type: ignore[no-untyped-def]
    async with signed_client(SECRET) as c:
        yield c


async def test_a_verified_copy_is_installed_under_its_sha256(tmp_path, source, servers, client) -> None:
    _, sha = source
    local = tmp_path / "joiner" / "datasets"
    path = await fetch_dataset(client, sha, [servers["good"].addr], local)
    assert path == local / sha and verify_dataset(path, sha) is None
    assert load_dataset(path, expect_sha256=sha).sha256 == sha  # the trainer accepts it as the same data
    assert sorted(p.name for p in local.iterdir()) == [sha]  # no staging dir left behind
    # Already installed and verified: no peer is asked at all.
    assert await fetch_dataset(client, sha, [], local) == path


async def test_a_corrupt_file_is_refused_by_name_and_nothing_installed(tmp_path, source, servers, client) -> None:
    _, sha = source
    local = tmp_path / "joiner" / "datasets"
    with pytest.raises(DatasetFetchError) as info:
        await fetch_dataset(client, sha, [servers["corrupt"].addr], local)
    why = info.value.failures[servers["corrupt"].addr]
    assert sha in str(info.value) and "train.npz corrupt" in why and "sha256" in why
    assert not local.exists() or list(local.iterdir()) == []  # neither the dataset nor a partial copy
    # The next peer with a good copy is used.
    path = await fetch_dataset(client, sha, [servers["corrupt"].addr, servers["good"].addr], local)
    assert verify_dataset(path, sha) is None


async def test_endpoints_check_ids_names_and_signatures(source, servers, client) -> None:
    _, sha = source
    addr = servers["good"].addr
    assert (await client.request("GET", addr, "/datasets/not-a-sha/manifest"))[0] == 400
    assert (await client.request("GET", addr, f"/datasets/{'0' * 64}/manifest"))[0] == 404
    assert (await client.request("GET", addr, f"/datasets/{sha}/files/games.db"))[0] == 404  # not in the manifest
    status, manifest = await client.request("GET", addr, f"/datasets/{sha}/manifest")
    assert status == 200 and set(manifest["files"]) == {"train.npz", "holdout.npz"}
    await refused_both_ways(addr, "GET", f"/datasets/{sha}/manifest")
