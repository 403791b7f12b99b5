"""The manifest.json that names a directory's content (an NPZ dataset, a rollout dataset, a
Hugging Face model directory): one reader and one verifier for every kind.

The reader refuses a missing, unreadable, foreign or too-new manifest the same way and names
the file. A directory's identity is the sha256 of these bytes, so the reader returns them
hashed as read, never re-serialised. The verifier (`verify_dir`) checks the directory against
them: every listed file present as a plain file with its size and sha256, and nothing else
beside the manifest. Every reader of such a directory (a trainer loading its dataset, a
fetcher reusing an installed copy, a node installing or promoting a model) runs that one check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

Reader = Callable[[Path], tuple[dict, str]]  # (manifest, its sha256); a ValueError when unusable

MANIFEST_NAME = "manifest.json"


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest_file(
    directory: str | Path,
    what: str,
    error: type[Exception],
    newest_format: int | None,
    check: Callable[[dict], None] | None = None,
    kind: str | None = None,
) -> tuple[dict, str]:
    """(manifest, sha256) of `directory`'s manifest; `error` (naming the file and `what` kind
    of manifest it should be) when it is missing, unreadable, not a JSON object, of another
    `kind`, of a newer format, or refused by `check` (which raises ValueError, KeyError or
    TypeError)."""
    path = Path(directory) / MANIFEST_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: {what} manifest not found") from None
    except OSError as exc:
        raise error(f"{path}: {what} manifest unreadable: {exc.strerror or exc}") from None
    try:
        manifest = json.loads(raw)
        if not isinstance(manifest, dict):
            raise ValueError("not a JSON object")
        if kind is not None and manifest.get("kind") != kind:
            raise ValueError(f"not a {kind} manifest")
        if newest_format is not None and int(manifest.get("format", -1)) > newest_format:
            raise ValueError(f"format {manifest['format']} is newer than this program's {newest_format}")
        if check is not None:
            check(manifest)
    except (ValueError, TypeError, KeyError) as exc:
        raise error(f"{path}: invalid {what} manifest: {exc}") from None
    return manifest, bytes_sha256(raw)


class ManifestError(ValueError):
    """A directory whose manifest is missing or unusable; names the file."""


def read_any_manifest(directory: str | Path) -> tuple[dict, str]:
    """(manifest, sha256) of a manifest directory of any kind and format."""
    return read_manifest_file(directory, "directory", ManifestError, None)


def verify_dir(path: str | Path, sha256: str | None = None, read: Reader = read_any_manifest) -> str | None:
    """None when `path` holds exactly what its manifest lists (read by `read`, the kind's own
    reader) and the manifest hashes to `sha256` when given; else what is wrong, naming the file:
    a listed file missing or not a plain file, a size or sha256 that differs, a file the
    manifest does not list."""
    path = Path(path)
    try:
        manifest, actual = read(path)
    except ValueError as exc:
        return str(exc)
    if sha256 is not None and actual != sha256:
        return f"{path / MANIFEST_NAME}: hashes to {actual[:16]}, not {sha256[:16]}"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return f"{path / MANIFEST_NAME}: lists no files"
    try:
        present = {entry.name for entry in path.iterdir() if entry.name != MANIFEST_NAME}
    except OSError as exc:
        return f"{path}: unreadable: {exc.strerror or exc}"
    if present - set(files):
        return f"{path}: files the manifest does not list: {sorted(present - set(files))}"
    for name, entry in files.items():
        file = path / name
        try:
            size, want = int(entry["bytes"]), str(entry["sha256"])
        except (KeyError, TypeError, ValueError):
            return f"{path / MANIFEST_NAME}: the entry of {name} needs sha256 and bytes"
        if file.is_symlink() or not file.is_file():
            return f"{file}: missing (or not a plain file)"
        actual_size = file.stat().st_size
        if actual_size != size:
            return f"{file}: truncated or altered: {actual_size} bytes, the manifest says {size}"
        if file_digest(file) != want:
            return f"{file}: sha256 does not match the manifest ({want[:16]}): corrupt or replaced"
    return None


def verify_stored_model(path: str | Path, sha256: str) -> str | None:
    """None when a stored model still is what `sha256` names: a model file whose bytes hash to
    it, or a model directory whose manifest does and whose files match that manifest."""
    path = Path(path)
    if path.is_dir():
        return verify_dir(path, sha256)
    if not path.is_file():
        return f"{path}: model file is missing"
    actual = file_digest(path)
    if actual != sha256:
        return f"{path}: has sha256 {actual[:12]}, not {sha256[:12]} (file replaced or corrupt)"
    return None
