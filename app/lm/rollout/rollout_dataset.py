"""Export of the LM workload: a window of stored rollouts -> a dataset directory with a
manifest, the input of one generation's GRPO run.

    <dir>/groups.jsonl    one app/lm Group per line (Group.to_dict), oldest first, whole groups
    <dir>/manifest.json   {"format", "kind": "lm_rollouts", "task", "groups", "samples",
                           "weight_versions": [oldest, newest], "dropped_groups": {reason: n},
                           "files": {name: {sha256, bytes}}}

`dropped_groups` counts the groups this node's rollout filter dropped while the window's
groups were made (since its oldest one), by reason: what the generation trained without.

As with the Connect Four dataset, the identity is the sha256 of the manifest, which lists
the sha256 of every file, so a joiner of a spanned run can fetch exactly this data by id
(dataset_fetch.fetch_manifest_dir with this module's reader) and a loader refuses a copy
that differs by one byte, naming the file. The directory is written under a staging name and
renamed whole. Groups older than `min_version` (the staleness bound) are left out.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

from app.atomic_files import fsync_dir, fsync_file
from app.db.rollout_store import RolloutStore
from app.lm.samples import Group
from app.lm.rollout.batches import to_group
from app.shared.manifests import MANIFEST_NAME, bytes_sha256, file_digest, read_manifest_file, verify_dir

KIND = "lm_rollouts"
FORMAT = 1
GROUPS_NAME = "groups.jsonl"


class RolloutDatasetError(ValueError):
    """A rollout dataset that is missing, corrupt or not what the caller expects; names the path."""


@dataclass(frozen=True)
class RolloutExport:
    path: Path
    sha256: str
    groups: int
    samples: int


def export_rollouts(store: RolloutStore, out_dir: str | Path, *, window_groups: int,
                    min_version: int | None = None) -> RolloutExport:
    """The newest `window_groups` groups (at least `min_version` old, when given) into `out_dir`."""
    out = Path(out_dir)
    if out.exists():
        raise RolloutDatasetError(f"{out}: already exists; an export never overwrites a dataset")
    records = store.groups(newest=window_groups, min_version=min_version)
    if not records:
        raise RolloutDatasetError(f"{store.path}: no rollouts to export"
                                  + (f" at weight version >= {min_version}" if min_version is not None else ""))
    tasks = sorted({r.task for r in records})
    if len(tasks) != 1:
        raise RolloutDatasetError(f"{store.path}: the window mixes tasks {tasks}; one generation trains one task")
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".staging-{out.name}-{secrets.token_hex(4)}")
    staging.mkdir()
    try:
        with open(staging / GROUPS_NAME, "w", encoding="utf-8") as fh:
            for record in records:
                fh.write(json.dumps(to_group(record).to_dict(), separators=(",", ":")) + "\n")
        fsync_file(staging / GROUPS_NAME)
        versions = [r.weight_version for r in records]
        samples = sum(len(r.samples) for r in records)
        manifest = {"format": FORMAT, "kind": KIND, "task": tasks[0], "groups": len(records), "samples": samples,
                    "weight_versions": [min(versions), max(versions)],
                    "dropped_groups": store.dropped_counts(since=min(r.created_at for r in records)),
                    "files": {GROUPS_NAME: {"sha256": file_digest(staging / GROUPS_NAME),
                                            "bytes": (staging / GROUPS_NAME).stat().st_size}}}
        raw = json.dumps(manifest, indent=2, sort_keys=True).encode()
        (staging / MANIFEST_NAME).write_bytes(raw)
        fsync_file(staging / MANIFEST_NAME)
        fsync_dir(staging)
        os.replace(staging, out)
        fsync_dir(out.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return RolloutExport(out, bytes_sha256(raw), len(records), samples)


def read_rollout_manifest(path: str | Path) -> tuple[dict, str]:
    """(manifest, sha256) of a rollout dataset; RolloutDatasetError names the manifest."""
    return read_manifest_file(path, "rollout", RolloutDatasetError, FORMAT, _check_rollout_manifest, kind=KIND)


def _check_rollout_manifest(manifest: dict) -> None:
    if set(manifest["files"]) != {GROUPS_NAME}:
        raise ValueError(f"files must be exactly {GROUPS_NAME}")


def verify_rollout_dataset(path: str | Path, sha256: str | None = None) -> str | None:
    """The one manifest check (app/shared/manifests.verify_dir) with this kind's reader."""
    return verify_dir(path, sha256, read_rollout_manifest)


def load_rollout_dataset(path: str | Path, expect_sha256: str | None = None) -> list[Group]:
    """The groups of a verified rollout dataset, in export order (each validated by app/lm)."""
    problem = verify_rollout_dataset(path, expect_sha256)
    if problem is not None:
        raise RolloutDatasetError(problem)
    groups = []
    with open(Path(path) / GROUPS_NAME, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            try:
                groups.append(Group.from_dict(json.loads(line)))
            except (ValueError, TypeError, KeyError) as exc:
                raise RolloutDatasetError(f"{Path(path) / GROUPS_NAME}:{number}: not a group: {exc}") from None
    return groups
