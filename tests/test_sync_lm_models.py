"""LM models as Hugging Face checkpoint directories named by the sha256 of their manifest:
the manifest (computed, verified), the local install (staged, verified, renamed whole), and
the fetch from peers between real MeshNodes on loopback, by the same machinery as datasets."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from app.coordination.p2p.client import MeshClient
from app.lm.workload.lm_model_fetch import ROUTE, LMModelFetchError, fetch_lm_model, lm_model_routes
from app.lm.causal_lm import LMModelConfig, build_model, load_model, save_model
from app.lm.tokenizer import build_digit_tokenizer
from app.games.train.dataset import MANIFEST_NAME
from app.lm.model_dir import (
    ModelDirError, install_model_dir, manifest_bytes, read_model_manifest, verify_model_dir, write_manifest,
)
from tests.mesh_helpers import refused_both_ways
from tests.sync_helpers import serving, signed_client

pytestmark = pytest.mark.timeout(120)
SECRET = b"lm-model-sync-secret"
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A save_pretrained directory of a small model, with the logits it gives on a fixed input."""
    tok = build_digit_tokenizer()
    model = build_model(LMModelConfig(hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate=64,
                                      max_position=32, seed=5), tok)
    src = save_model(model, tok, tmp_path_factory.mktemp("src") / "hf")
    ids = torch.tensor([tok("copy:123=")["input_ids"]])
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    return src, ids, logits


def test_the_manifest_names_every_file_and_the_identity_follows_the_bytes(tmp_path: Path, saved) -> None:
    src, _, _ = saved
    work = shutil.copytree(src, tmp_path / "m")
    sha = write_manifest(work)
    manifest, read_sha = read_model_manifest(work)
    assert read_sha == sha and {"config.json", "model.safetensors", "tokenizer.json"} <= set(manifest["files"])
    assert MANIFEST_NAME not in manifest["files"] and verify_model_dir(work, sha) is None
    assert write_manifest(shutil.copytree(src, tmp_path / "again")) == sha  # deterministic
    (work / "extra.bin").write_bytes(b"x")
    assert "does not list" in verify_model_dir(work, sha)
    (work / "extra.bin").unlink()
    weights = work / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert str(weights) in verify_model_dir(work, sha)
    assert "hashes to" in verify_model_dir(work, "0" * 64)
    (work / "sub").mkdir()
    with pytest.raises(ModelDirError, match="sub"):
        manifest_bytes(work)
    (work / "sub").rmdir()
    (work / "config.json").unlink()
    with pytest.raises(ModelDirError, match="config.json"):
        manifest_bytes(work)


def test_install_is_staged_verified_whole_and_idempotent(tmp_path: Path, saved) -> None:
    src, ids, logits = saved
    sha, path = install_model_dir(shutil.copytree(src, tmp_path / "cand"), tmp_path / "models")
    assert path == tmp_path / "models" / sha and verify_model_dir(path, sha) is None
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [sha]  # no staging left
    with torch.no_grad():
        assert torch.equal(load_model(path)(input_ids=ids).logits, logits)
    before = (path / "model.safetensors").stat().st_mtime_ns
    assert install_model_dir(tmp_path / "cand", tmp_path / "models") == (sha, path)
    assert (path / "model.safetensors").stat().st_mtime_ns == before  # a verified copy is kept
    (path / "config.json").write_text("{}")  # damaged in place: the next install replaces it whole
    assert install_model_dir(tmp_path / "cand", tmp_path / "models") == (sha, path)
    assert verify_model_dir(path, sha) is None


@pytest.fixture
async def peers(tmp_path: Path, saved):  # type: ignore[no-untyped-def]
    """Two nodes serving the model: `good` as installed, `corrupt` with one weight byte flipped."""
    src, _, _ = saved
    sha, path = install_model_dir(shutil.copytree(src, tmp_path / "cand"), tmp_path / "good" / "lm_models")
    bad_root = tmp_path / "corrupt" / "lm_models"
    bad = shutil.copytree(path, bad_root / sha)
    data = bytearray((bad / "model.safetensors").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (bad / "model.safetensors").write_bytes(bytes(data))
    async with serving(tmp_path, {"good": lm_model_routes(path.parent), "corrupt": lm_model_routes(bad_root)},
                       SECRET) as nodes:
        yield sha, nodes


@pytest.fixture
async def client():  # type: ignore[no-untyped-def]
    async with signed_client(SECRET) as c:
        yield c


async def test_a_peer_fetches_the_promoted_model_verified_and_whole(tmp_path: Path, saved, peers, client) -> None:
    _, ids, logits = saved
    sha, nodes = peers
    local = tmp_path / "joiner" / "lm_models"
    with pytest.raises(LMModelFetchError) as info:
        await fetch_lm_model(client, sha, [nodes["corrupt"].addr], local)
    why = info.value.failures[nodes["corrupt"].addr]
    assert sha in str(info.value) and "model.safetensors corrupt" in why
    assert not local.exists() or list(local.iterdir()) == []  # neither the model nor a partial copy
    path = await fetch_lm_model(client, sha, [nodes["corrupt"].addr, nodes["good"].addr], local)
    assert path == local / sha and verify_model_dir(path, sha) is None
    assert sorted(p.name for p in local.iterdir()) == [sha]
    with torch.no_grad():
        assert torch.equal(load_model(path)(input_ids=ids).logits, logits)  # the same weights, loaded offline
    assert await fetch_lm_model(client, sha, [], local) == path  # installed and verified: nobody asked


async def test_model_endpoints_check_ids_names_and_signatures(peers, client) -> None:
    sha, nodes = peers
    addr = nodes["good"].addr
    assert (await client.request("GET", addr, f"{ROUTE}/not-a-sha/manifest"))[0] == 400
    assert (await client.request("GET", addr, f"{ROUTE}/{'0' * 64}/manifest"))[0] == 404
    assert (await client.request("GET", addr, f"{ROUTE}/{sha}/files/..%2Fsecret"))[0] == 404
    status, manifest = await client.request("GET", addr, f"{ROUTE}/{sha}/manifest")
    assert status == 200 and manifest["kind"] == "hf_checkpoint" and "model.safetensors" in manifest["files"]
    await refused_both_ways(addr, "GET", f"{ROUTE}/{sha}/manifest")
