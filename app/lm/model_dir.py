"""A promoted LM model is a Hugging Face checkpoint directory; its identity is the sha256 of
its manifest, as a dataset's is (app/games/train/dataset.py).

    <dir>/config.json, model.safetensors (or shards + index), tokenizer.json, ...
    <dir>/manifest.json   {"format": 1, "kind": "hf_checkpoint", "files": {name: {sha256, bytes}}}

The manifest lists every file of the directory with its sha256 and size, so a copy can be
checked byte for byte; the directory must be flat (what `save_pretrained` writes), and a
subdirectory, a link or a hidden file is refused by its path rather than silently left out.
A node keeps promoted models as `<models_root>/<sha256>/`: `install_model_dir` copies a
directory there through a staging directory that is verified, then renamed into place whole,
so the final name never holds a partial or unverified copy. Peers fetch the same layout over
the mesh (app/lm/workload/lm_model_fetch.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import time
from pathlib import Path

from app.atomic_files import atomic_write_text, fsync_dir, fsync_file
from app.shared.manifests import MANIFEST_NAME, bytes_sha256, file_digest, read_manifest_file, verify_dir

KIND = "hf_checkpoint"
FORMAT = 1
_FILE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")  # as the fetcher accepts: no path, no hidden file


class ModelDirError(ValueError):
    """A model directory that is missing, incomplete, corrupt or not flat; names the path."""


def model_files(path: Path) -> list[Path]:
    """The files a manifest lists: every plain file of the flat directory but the manifest."""
    files = []
    for entry in sorted(path.iterdir()):
        if entry.name == MANIFEST_NAME:
            continue
        if entry.is_symlink() or not entry.is_file():
            raise ModelDirError(f"{entry}: a model directory holds only plain files (no links or subdirectories)")
        if not _FILE_NAME.fullmatch(entry.name):
            raise ModelDirError(f"{entry}: not a plain file name a peer would accept")
        files.append(entry)
    return files


def manifest_bytes(path: str | Path) -> bytes:
    """The manifest of `path` as it would be written (deterministic: same files, same bytes)."""
    path = Path(path)
    if not path.is_dir():
        raise ModelDirError(f"{path}: model directory not found")
    files = {f.name: {"sha256": file_digest(f), "bytes": f.stat().st_size} for f in model_files(path)}
    if "config.json" not in files:
        raise ModelDirError(f"{path}: no config.json: not a Hugging Face checkpoint directory")
    manifest = {"format": FORMAT, "kind": KIND, "files": files}
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def write_manifest(path: str | Path) -> str:
    """Hash every file of `path`, write its manifest atomically; the model's sha256."""
    raw = manifest_bytes(path)
    atomic_write_text(Path(path) / MANIFEST_NAME, raw.decode())
    return bytes_sha256(raw)


def read_model_manifest(path: str | Path) -> tuple[dict, str]:
    """(manifest, sha256) of a model directory; ModelDirError names the manifest when it is
    missing or not one of ours. Does not hash the files (verify_model_dir does)."""
    return read_manifest_file(path, "model", ModelDirError, FORMAT, _check_model_manifest, kind=KIND)


def _check_model_manifest(manifest: dict) -> None:
    files = manifest["files"]
    if not isinstance(files, dict) or "config.json" not in files:
        raise ValueError("files must be a mapping that lists config.json")
    for name, entry in files.items():
        if not _FILE_NAME.fullmatch(name) or name == MANIFEST_NAME:
            raise ValueError(f"file name {name!r} is not a plain name")
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str) or int(entry["bytes"]) < 0:
            raise ValueError(f"entry of {name} needs sha256 and bytes")


def verify_model_dir(path: str | Path, sha256: str | None = None) -> str | None:
    """The one manifest check (app/shared/manifests.verify_dir) with this kind's reader."""
    return verify_dir(path, sha256, read_model_manifest)


def installed_model_dir(models_root: str | Path, sha256: str) -> Path:
    return Path(models_root) / sha256


def _sweep(root: Path, max_age_s: float = 3600.0) -> None:
    """Staging copies left by a process killed mid-install; never read, only removed."""
    for stale in [*root.glob(".install-*"), *root.glob(".old-*")]:
        try:
            if time.time() - stale.stat().st_mtime > max_age_s:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


def install_model_dir(source: str | Path, models_root: str | Path) -> tuple[str, Path]:
    """Copy `source` (a save_pretrained directory; its manifest is written when missing) to
    `<models_root>/<sha256>/`: staged, verified, renamed whole. Idempotent: an installed,
    verified copy is kept as it is."""
    source = Path(source)
    if not (source / MANIFEST_NAME).exists():
        write_manifest(source)
    problem = verify_model_dir(source)
    if problem is not None:
        raise ModelDirError(problem)
    sha = read_model_manifest(source)[1]
    root = Path(models_root)
    final = installed_model_dir(root, sha)
    if final.is_dir() and verify_model_dir(final, sha) is None:
        return sha, final
    root.mkdir(parents=True, exist_ok=True)
    _sweep(root)
    staging = root / f".install-{sha[:16]}-{secrets.token_hex(4)}"
    try:
        shutil.copytree(source, staging)
        for f in staging.iterdir():
            fsync_file(f)
        problem = verify_model_dir(staging, sha)
        if problem is not None:
            raise ModelDirError(f"copy of {source} changed while installing: {problem}")
        fsync_dir(staging)
        if final.exists():  # a bad copy under the final name: moved aside, then removed
            old = root / f".old-{sha[:16]}-{secrets.token_hex(4)}"
            os.replace(final, old)
            shutil.rmtree(old, ignore_errors=True)
        os.replace(staging, final)
        fsync_dir(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return sha, final
