"""A node's state in one archive, taken while it runs, and restored onto a new data dir.

    save:    the node's plain files (pipeline state and history, mesh term and commits, decided
             generations, event journal, secret), then each SQL store through SQLite's online
             backup API (or, on a database URL, a table copy in one consistent read:
             app/db/table_copy.py), then `models/` and `lm_models/` last: a model is in its
             store before the registry or the state names it, so every model they name is in.
             One tar archive, `manifest.json` first with every file's size and sha256, written
             under a temp name, fsynced and renamed.
    restore: every member checked against the manifest (path, size, sha256, none missing, none
             extra) while it is written into a staging dir beside the target; only a complete,
             verified copy is renamed into place, and only onto a missing or empty dir.

Left out: `datasets/`, `runs/` (made again from games), `sync/` (per-peer cursors) and hidden
temp files. A generation in flight in the snapshot starts over after a restore.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import socket
import sqlite3
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sqlalchemy.exc import SQLAlchemyError

from app.atomic_files import fsync_dir, replace_durably, temp_sibling
from app.config.paths import NodePaths
from app.db.engines import display_name
from app.db.table_copy import STORES, TableCopyError, dump_database, load_database

FORMAT = "mesh-snapshot/1"
MANIFEST = "manifest.json"
TREES = ("models", "lm_models")  # content-addressed: copied last
SKIPPED_SUFFIXES = ("-wal", "-shm", "-journal")
CHUNK = 1 << 20


class SnapshotError(RuntimeError):
    """An archive or a dir that cannot be used: one line naming the path and what is wrong."""


@dataclass(frozen=True)
class Restored:
    data_dir: Path
    manifest: dict
    rewound: str | None  # the in-flight stage a restore started over, if any


def save(paths: NodePaths, out: Path, node_id: str | None = None) -> dict:
    """Snapshot the node whose files are `paths` (running or not) into `out`; the manifest."""
    data_dir = paths.data_dir
    if not data_dir.is_dir():
        raise SnapshotError(f"{data_dir}: no such data dir")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        started = time.monotonic()
        for src in sorted(data_dir.iterdir()):
            if src.is_file() and not _skipped(src.name) and not src.name.endswith(".db"):
                shutil.copy2(src, staging / src.name)
        for src in sorted(data_dir.glob("*.db")):
            if not paths.db_url or src.name not in STORES:  # with a URL, a leftover file is not the store
                _backup_sqlite(src, staging / src.name)
        if paths.db_url:
            try:
                dump_database(paths.db_url, staging)
            except SQLAlchemyError as exc:
                raise SnapshotError(f"{display_name(paths.db_url)}: cannot read it: {exc.__class__.__name__}: "
                                    f"{str(exc).splitlines()[0]}") from None
        for tree in TREES:
            if (data_dir / tree).is_dir():
                _copy_tree(data_dir / tree, staging / tree)
        manifest = {"format": FORMAT, "created_at": time.time(), "host": socket.gethostname(),
                    "node_id": node_id, "data_dir": str(data_dir.resolve()),
                    "database": "postgresql" if paths.db_url else "sqlite",
                    "source_database": display_name(paths.db_url) if paths.db_url else None,
                    "summary": summarize(staging), "files": _digests(staging),
                    "copy_s": round(time.monotonic() - started, 3)}
        _write_archive(staging, manifest, out)
        return manifest
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _skipped(name: str) -> bool:
    return name.startswith(".") or name.endswith(SKIPPED_SUFFIXES) or name.startswith("test_hold_")


def _backup_sqlite(src: Path, dst: Path) -> None:
    """SQLite's online backup: one consistent copy while the node writes (WAL: it is not
    blocked; a write from another process during the copy makes SQLite start it over)."""
    source = sqlite3.connect(src, timeout=30)
    target = sqlite3.connect(dst)
    try:
        source.backup(target)
        target.execute("PRAGMA journal_mode=DELETE")  # one self-contained file in the archive
    except sqlite3.Error as exc:
        raise SnapshotError(f"{src}: cannot back up: {exc}") from None
    finally:
        target.close()
        source.close()


def _copy_tree(src: Path, dst: Path) -> None:
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if any(_skipped(part) for part in rel.parts):
            continue
        if path.is_dir():
            (dst / rel).mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dst / rel)


def _digests(root: Path) -> dict[str, dict]:
    files = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        files[path.relative_to(root).as_posix()] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return files


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def summarize(data_dir: Path) -> dict:
    """What an operator checks a restore by: games, models and their status, the best, the
    pipeline's generation; read from SQLite files (a snapshot's, or a restored SQLite node's)."""
    summary: dict = {}
    try:
        _summarize_stores(data_dir, summary)
    except sqlite3.Error as exc:  # a store of another shape (an LM node's): named, not fatal
        summary["unreadable"] = str(exc)
    state = data_dir / "pipeline_state.json"
    if state.exists():
        data = json.loads(state.read_text())
        summary["pipeline"] = {k: data.get(k) for k in ("generation", "stage", "best_sha256", "best_generation")}
    return summary


def _summarize_stores(data_dir: Path, summary: dict) -> None:
    games = data_dir / "games.db"
    if games.exists():
        with _readonly(games) as db:
            count, newest = db.execute("SELECT COUNT(*), COALESCE(MAX(id), 0) FROM games").fetchone()
            summary["games"] = {"count": count, "newest_id": newest}
    registry = data_dir / "registry.db"
    if registry.exists():
        with _readonly(registry) as db:
            rows = db.execute("SELECT sha256, generation, status FROM models ORDER BY generation, id").fetchall()
            summary["models"] = [{"sha256": s, "generation": g, "status": st} for s, g, st in rows]
            best = db.execute("SELECT sha256 FROM models WHERE current_since IS NOT NULL "
                              "ORDER BY current_since DESC LIMIT 1").fetchone()
            summary["best_sha256"] = best[0] if best else None


class _readonly:
    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)

    def __enter__(self) -> sqlite3.Connection:
        return self.db

    def __exit__(self, *exc: object) -> None:
        self.db.close()


def _write_archive(staging: Path, manifest: dict, out: Path) -> None:
    tmp = temp_sibling(out)
    try:
        with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
            body = json.dumps(manifest, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime, info.mode = len(body), int(manifest["created_at"]), 0o600
            tar.addfile(info, io.BytesIO(body))
            for rel in manifest["files"]:
                tar.add(staging / rel, arcname=rel, recursive=False)
        os.chmod(tmp, 0o600)  # it holds the mesh secret when the node has one
        replace_durably(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)


def read_verified(archive: Path, into: Path | None = None) -> dict:
    """The archive's manifest once every member matched it (written under `into` if given);
    SnapshotError naming the archive and the first thing wrong otherwise."""
    if not archive.is_file():
        raise SnapshotError(f"{archive}: no such snapshot file")
    try:
        with tarfile.open(archive, "r:") as tar:
            first = tar.next()
            if first is None or first.name != MANIFEST or not first.isfile():
                raise SnapshotError(f"{archive}: not a snapshot: {MANIFEST} is not its first member")
            manifest = _manifest(archive, tar.extractfile(first).read())
            seen: set[str] = set()
            for member in tar:
                if member is first:  # iteration starts over at the members already read
                    continue
                _check_member(archive, member, manifest, seen)
                _copy_member(archive, tar, member, manifest["files"][member.name], into)
                seen.add(member.name)
    except (tarfile.ReadError, EOFError) as exc:
        raise SnapshotError(f"{archive}: truncated or corrupt archive ({exc}); take the snapshot again") from None
    missing = sorted(set(manifest["files"]) - seen)
    if missing:
        raise SnapshotError(f"{archive}: partial snapshot: {len(missing)} file(s) of the manifest missing, "
                            f"first {missing[0]}")
    return manifest


def _manifest(archive: Path, body: bytes) -> dict:
    try:
        manifest = json.loads(body)
    except ValueError as exc:
        raise SnapshotError(f"{archive}: unreadable {MANIFEST}: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or not isinstance(manifest.get("files"), dict):
        raise SnapshotError(f"{archive}: {MANIFEST} is not a {FORMAT} manifest")
    return manifest


def _check_member(archive: Path, member: tarfile.TarInfo, manifest: dict, seen: set[str]) -> None:
    name = PurePosixPath(member.name)
    if name.is_absolute() or ".." in name.parts or not member.isfile():
        raise SnapshotError(f"{archive}: refused member {member.name!r} (not a plain file inside the snapshot)")
    if member.name not in manifest["files"] or member.name in seen:
        raise SnapshotError(f"{archive}: member {member.name} is not in the manifest (or twice)")
    if member.size != manifest["files"][member.name]["size"]:
        raise SnapshotError(f"{archive}: {member.name} is {member.size} bytes, the manifest says "
                            f"{manifest['files'][member.name]['size']}")


def _copy_member(archive: Path, tar: tarfile.TarFile, member: tarfile.TarInfo, expected: dict,
                 into: Path | None) -> None:
    source = tar.extractfile(member)
    assert source is not None
    digest, size = hashlib.sha256(), 0
    target = None
    if into is not None:
        (into / member.name).parent.mkdir(parents=True, exist_ok=True)
        target = open(into / member.name, "wb")
    try:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
            if target is not None:
                target.write(chunk)
    finally:
        if target is not None:
            target.close()
    if size != expected["size"]:
        raise SnapshotError(f"{archive}: truncated: {member.name} ends after {size} of {expected['size']} bytes")
    if digest.hexdigest() != expected["sha256"]:
        raise SnapshotError(f"{archive}: {member.name}: sha256 {digest.hexdigest()[:12]} does not match the "
                            f"manifest's {expected['sha256'][:12]}: the archive is corrupt")


def restore(archive: Path, data_dir: Path, db_url: str | None = None) -> Restored:
    """Verify `archive` whole, then make it the new node's data dir (and, with `db_url`, load
    its stores into that empty database). Never writes into a dir that holds anything."""
    if data_dir.exists() and (not data_dir.is_dir() or any(data_dir.iterdir())):
        raise SnapshotError(f"{data_dir}: not empty (a node's data dir?): restore into a new or empty dir")
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{data_dir.name}.restore-", dir=data_dir.parent))
    try:
        manifest = read_verified(archive, into=staging)
        if db_url:
            stores = {name: staging / name for name in STORES if (staging / name).exists()}
            try:
                load_database(db_url, stores)
            except TableCopyError as exc:
                raise SnapshotError(str(exc)) from None
            except SQLAlchemyError as exc:
                raise SnapshotError(f"{display_name(db_url)}: cannot restore into it: {exc.__class__.__name__}: "
                                    f"{str(exc).splitlines()[0]}") from None
            for path in stores.values():
                path.unlink()
        rewound = _rewind_in_flight(staging)
        fsync_dir(staging)
        if data_dir.exists():
            data_dir.rmdir()  # empty, checked above
        os.replace(staging, data_dir)
        fsync_dir(data_dir.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _rebase_registry(NodePaths(data_dir, db_url))
    return Restored(data_dir, manifest, rewound)


def _rewind_in_flight(data_dir: Path) -> str | None:
    """The snapshot leaves out datasets and runs, so a generation caught between export and
    its decision starts over from collecting (as after a lost claim); returns its stage."""
    from app.coordination.pipeline.state import PipelineStateStore, Stage, abandoned

    store = PipelineStateStore(data_dir / "pipeline_state.json")
    if not store.path.exists():
        return None
    state = store.load()
    if state.stage == Stage.COLLECTING:
        return None
    store.save(abandoned(state))
    return state.stage.value


def _rebase_registry(paths: NodePaths) -> None:
    from app.db.registry import ModelRegistry

    if paths.db_url or (paths.data_dir / "registry.db").exists():
        with ModelRegistry(paths.registry_db) as registry:
            registry.rebase_paths(paths.data_dir)
