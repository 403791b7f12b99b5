"""A node's model store: promoted models by sha256, installed atomically and verified.

Self-play only ever reads models from here, and a file lands here only after its bytes hash
to the sha256 it is filed under, so a corrupt copy (a bad disk, a truncated download) is
never played with. Local promotion and mesh distribution both end in `install_model`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from app.atomic_files import fsync_file
from app.ai.model import ModelFormatError, file_sha256, read_meta, sidecar_path


def install_model(src: str | Path, models_dir: str | Path, sha256: str) -> Path:
    """Copy the model at `src` (weights + sidecar) to `<models_dir>/<sha256>.safetensors`.

    Idempotent: an existing, verified copy is kept. Raises ModelFormatError (naming the path)
    when the source does not hash to `sha256`; nothing is installed then.
    """
    src, models_dir = Path(src), Path(models_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    final = models_dir / f"{sha256}.safetensors"
    if final.exists() and sidecar_path(final).exists() and file_sha256(final) == sha256:
        return final
    tmp = models_dir / f".{sha256}.safetensors.tmp{os.getpid()}"
    tmp_side = models_dir / f".{sha256}.json.tmp{os.getpid()}"
    try:
        shutil.copyfile(src, tmp)
        shutil.copyfile(sidecar_path(src), tmp_side)
        actual = file_sha256(tmp)
        if actual != sha256:
            raise ModelFormatError(f"{src}: sha256 {actual[:12]} is not the expected {sha256[:12]}; not installed")
        if read_meta(src).sha256 != sha256:
            raise ModelFormatError(f"{sidecar_path(src)}: sidecar names another model than {sha256[:12]}")
        fsync_file(tmp)
        fsync_file(tmp_side)
        os.replace(tmp, final)  # weights first: a sidecar never names a missing file
        os.replace(tmp_side, sidecar_path(final))
    finally:
        for leftover in (tmp, tmp_side):
            leftover.unlink(missing_ok=True)
    return final
