"""Model files: round trip, identity by sha256, and clear refusals of anything that does not match."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from app.games.search.model import (
    Architecture, ModelFormatError, ModelMeta, file_sha256, load_model, new_model, predict, read_meta, save_model,
)

ARCH = Architecture(channels=8, blocks=1, plane_shape=(3, 6, 7), num_actions=7)


def _saved(tmp_path, **meta):
    net = new_model(ARCH, seed=3)
    path = tmp_path / "m.safetensors"
    return net, path, save_model(net, ModelMeta(ARCH, "connect4", **meta), path)


def test_round_trip_keeps_weights_and_lineage(tmp_path) -> None:
    net, path, meta = _saved(tmp_path, generation=2, parent_sha256="ab" * 32, dataset_sha256="cd" * 32)
    assert meta.sha256 == file_sha256(path)
    loaded, lmeta = load_model(path, expect_game="connect4", expect_arch=ARCH, expect_sha256=meta.sha256)
    assert lmeta == meta and lmeta.generation == 2 and lmeta.parent_sha256 == "ab" * 32
    planes = np.random.default_rng(0).random((5, 3, 6, 7), dtype=np.float32)
    legal = np.ones((5, 7), dtype=bool)
    legal[:, 0] = False
    p1, v1 = predict(net, planes, legal)
    p2, v2 = predict(loaded, planes, legal)
    assert np.allclose(p1, p2) and np.allclose(v1, v2)
    assert np.allclose(p1.sum(axis=1), 1) and np.all(p1[:, 0] == 0)
    assert np.all(np.abs(v1) < 1)
    assert not list(tmp_path.glob(".*tmp*")), "temp files left behind"


def test_same_seed_same_sha(tmp_path) -> None:
    a = save_model(new_model(ARCH, seed=1), ModelMeta(ARCH, "connect4", created_at=0), tmp_path / "a.safetensors")
    b = save_model(new_model(ARCH, seed=1), ModelMeta(ARCH, "connect4", created_at=0), tmp_path / "b.safetensors")
    c = save_model(new_model(ARCH, seed=2), ModelMeta(ARCH, "connect4", created_at=0), tmp_path / "c.safetensors")
    assert a.sha256 == b.sha256 != c.sha256


def test_the_channels_last_layout_changes_neither_files_nor_outputs(tmp_path) -> None:
    """The network keeps NHWC weights for speed; its files and answers are those of the NCHW layout."""
    fast = new_model(ARCH, seed=1)
    plain = new_model(ARCH, seed=1).to(memory_format=torch.contiguous_format)
    conv = fast.stem[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    a = save_model(fast, ModelMeta(ARCH, "connect4", created_at=0), tmp_path / "a.safetensors")
    b = save_model(plain, ModelMeta(ARCH, "connect4", created_at=0), tmp_path / "b.safetensors")
    assert a.sha256 == b.sha256
    loaded, _ = load_model(tmp_path / "b.safetensors")
    assert loaded.stem[0].weight.is_contiguous(memory_format=torch.channels_last)
    planes = np.random.default_rng(1).random((9, 3, 6, 7), dtype=np.float32)
    for net in (plain, loaded):
        p, v = predict(net, planes)
        p_fast, v_fast = predict(fast, planes)
        assert np.allclose(p, p_fast, atol=1e-6) and np.allclose(v, v_fast, atol=1e-6)


def test_corrupt_weights_are_refused_by_path(tmp_path) -> None:
    _, path, _ = _saved(tmp_path)
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError, match="sha256.*does not match") as info:
        load_model(path)
    assert str(path) in str(info.value)


def test_mismatches_are_refused_with_clear_messages(tmp_path) -> None:
    _, path, meta = _saved(tmp_path)
    with pytest.raises(ModelFormatError, match="game 'connect4', expected 'chess'"):
        load_model(path, expect_game="chess")
    with pytest.raises(ModelFormatError, match="architecture"):
        load_model(path, expect_arch=Architecture(16, 1, (3, 6, 7), 7))
    with pytest.raises(ModelFormatError, match="not the expected"):
        load_model(path, expect_sha256="0" * 64)
    side = path.with_suffix(".json")
    data = json.loads(side.read_text())
    data["architecture"]["channels"] = 16
    side.write_text(json.dumps(data))
    with pytest.raises(ModelFormatError, match="do not fit"):
        load_model(path)
    side.unlink()
    with pytest.raises(ModelFormatError, match="sidecar missing"):
        read_meta(path)
    with pytest.raises(ModelFormatError, match="not found"):
        load_model(tmp_path / "absent.safetensors")
