"""A node's model store: promoted models by sha256, installed atomically and verified.

This module alone knows the layout (`<models_dir>/<sha256>.safetensors` beside its JSON
sidecar), how a model gets in (verify, then rename: weights first, so a sidecar never names a
missing file) and how one is looked up. Self-play only ever reads models from here, and a file
lands here only after its bytes hash to the sha256 it is filed under, so a corrupt copy (a bad
disk, a truncated download) is never played with. Local promotion (`install_model`) and mesh
distribution (`install_staged`, after a verified download) both end here.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.atomic_files import fsync_dir, fsync_file
from app.games.search.model_meta import ModelFormatError, file_sha256, read_meta, sidecar_path
from app.coordination.sync.wire import is_sha256

SUFFIX = ".safetensors"


def model_file(models_dir: str | Path, sha256: str) -> Path:
    """Where model `sha256` lives in the store (whether or not it is there)."""
    return Path(models_dir) / f"{sha256}{SUFFIX}"


def is_present(models_dir: str | Path, sha256: str) -> bool:
    """Weights and sidecar both there (cheap: no hashing); what a peer may be served."""
    path = model_file(models_dir, sha256)
    return path.is_file() and sidecar_path(path).is_file()


def is_installed(models_dir: str | Path, sha256: str) -> bool:
    """Present and the weights hash to their name (reads the whole file)."""
    return is_present(models_dir, sha256) and file_sha256(model_file(models_dir, sha256)) == sha256


def installed_models(models_dir: str | Path) -> list[str]:
    """The sha256s this node can serve (for the gossiped inventory); cheap: names, not hashes."""
    root = Path(models_dir)
    if not root.is_dir():
        return []
    return sorted(p.stem for p in root.glob(f"*{SUFFIX}") if is_sha256(p.stem) and sidecar_path(p).is_file())


def remove_model(models_dir: str | Path, sha256: str) -> int:
    """Delete model `sha256` (weights and sidecar) from the store; the bytes freed (0: not there)."""
    freed = 0
    for path in (model_file(models_dir, sha256), sidecar_path(model_file(models_dir, sha256))):
        if path.is_file():
            freed += path.stat().st_size
            path.unlink()
    return freed


def install_model(src: str | Path, models_dir: str | Path, sha256: str) -> Path:
    """Copy the model at `src` (weights + sidecar) into the store under `sha256`.

    Idempotent: an existing, verified copy is kept. Raises ModelFormatError (naming the path)
    when the source does not hash to `sha256`; nothing is installed then.
    """
    src, models_dir = Path(src), Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    final = model_file(models_dir, sha256)
    if is_installed(models_dir, sha256):
        return final
    tmp = models_dir / f".{sha256}{SUFFIX}.tmp{os.getpid()}"
    tmp_side = models_dir / f".{sha256}.json.tmp{os.getpid()}"
    try:
        shutil.copyfile(src, tmp)
        shutil.copyfile(sidecar_path(src), tmp_side)
        actual = file_sha256(tmp)
        if actual != sha256:
            raise ModelFormatError(f"{src}: sha256 {actual[:12]} is not the expected {sha256[:12]}; not installed")
        if read_meta(src).sha256 != sha256:
            raise ModelFormatError(f"{sidecar_path(src)}: sidecar names another model than {sha256[:12]}")
        _rename_into_store(tmp, tmp_side, final)
    finally:
        for leftover in (tmp, tmp_side):
            leftover.unlink(missing_ok=True)
    return final


def install_staged(weights: Path, models_dir: str | Path, sha256: str) -> Path:
    """Move verified staging files (weights + sidecar, on the store's filesystem) into place."""
    final = model_file(models_dir, sha256)
    _rename_into_store(weights, sidecar_path(weights), final)
    return final


def _rename_into_store(weights: Path, sidecar: Path, final: Path) -> None:
    fsync_file(weights)
    fsync_file(sidecar)
    os.replace(weights, final)  # weights first: a sidecar never names a missing file
    os.replace(sidecar, sidecar_path(final))
    fsync_dir(final.parent)
