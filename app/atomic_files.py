"""Crash-safe file writes: temp name, fsync, rename, fsync of the directory.

Every file another process or a restart reads (state, logs of decisions, cursors, models)
is written through here, so a kill at any instant leaves the old content or the new one,
never a torn file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any


def fsync_file(path: str | Path) -> None:
    with open(path, "rb+") as fh:
        os.fsync(fh.fileno())


def fsync_dir(path: str | Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def temp_sibling(path: Path) -> Path:
    """A hidden name beside `path`, unique per process, on the same filesystem (rename is atomic)."""
    return path.with_name(f".{path.name}.tmp{os.getpid()}")


def replace_durably(tmp: Path, final: Path) -> None:
    """fsync `tmp`, rename it over `final`, fsync the directory so the rename survives a crash."""
    fsync_file(tmp)
    os.replace(tmp, final)
    fsync_dir(final.parent)


def replace_dir(staging: Path, final: Path) -> None:
    """A finished directory into place whole: `staging` is fsynced and renamed to `final`; a
    directory already there is moved aside first and removed after, so the final name never
    holds a half-written copy."""
    fsync_dir(staging)
    old: Path | None = None
    if final.exists():
        old = final.with_name(f".{final.name}.old{os.getpid()}")
        os.replace(final, old)
    os.replace(staging, final)
    fsync_dir(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_sibling(path)
    try:
        tmp.write_text(text, encoding="utf-8")
        replace_durably(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_json(path: str | Path, data: Any, **dump_kwargs: Any) -> None:
    atomic_write_text(path, json.dumps(data, **({"sort_keys": True} | dump_kwargs)))
