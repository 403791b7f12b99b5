"""The manifest.json that names a directory's content (an NPZ dataset, a rollout dataset, a
Hugging Face model directory): one reader, so every kind refuses a missing, unreadable, foreign
or too-new manifest the same way and names the file. A directory's identity is the sha256 of
these bytes, so the reader returns them hashed as read, never re-serialised."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

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
    newest_format: int,
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
        if int(manifest.get("format", -1)) > newest_format:
            raise ValueError(f"format {manifest['format']} is newer than this program's {newest_format}")
        if check is not None:
            check(manifest)
    except (ValueError, TypeError, KeyError) as exc:
        raise error(f"{path}: invalid {what} manifest: {exc}") from None
    return manifest, bytes_sha256(raw)
