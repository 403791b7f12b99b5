"""A training dataset on disk: `<dir>/train.npz`, `<dir>/holdout.npz`, `<dir>/manifest.json`.

The manifest records the sha256 of every NPZ, and the dataset's identity (`dataset_sha256`,
written into each candidate's sidecar) is the sha256 of the manifest itself. Loading checks
every digest before it trusts a byte, so a truncated copy or a file swapped under the same
name is refused by its path instead of training a model on the wrong data.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.shared.manifests import MANIFEST_NAME, read_manifest_file, verify_dir

TRAIN_NAME = "train.npz"
HOLDOUT_NAME = "holdout.npz"
DATASET_FORMAT = 1
ARRAY_NAMES = ("planes", "policy", "value")


class DatasetError(ValueError):
    """A dataset that is missing, truncated, corrupt or not what the caller expects; names the path."""


@dataclass(frozen=True)
class Arrays:
    """Aligned training samples: planes (N, C, H, W), policy targets (N, A), values (N,), or
    (N, V) for a game with V = value_size > 1 (entry k: seat (to_move + k) % players)."""

    planes: np.ndarray
    policy: np.ndarray
    value: np.ndarray

    def __len__(self) -> int:
        return int(self.value.shape[0])

    @staticmethod
    def empty(plane_shape: tuple[int, ...], num_actions: int, value_size: int = 1) -> "Arrays":
        return Arrays(
            np.zeros((0, *plane_shape), np.float32),
            np.zeros((0, num_actions), np.float32),
            np.zeros((0,) if value_size == 1 else (0, value_size), np.float32),
        )


@dataclass(frozen=True)
class Dataset:
    path: Path
    manifest: dict
    sha256: str  # sha256 of manifest.json: the dataset's identity
    train: Arrays
    holdout: Arrays

    @property
    def game(self) -> str:
        return str(self.manifest["game"])


def read_manifest(path: str | Path) -> tuple[dict, str]:
    """(manifest, dataset_sha256) of a dataset directory; DatasetError names the manifest."""
    return read_manifest_file(path, "dataset", DatasetError, DATASET_FORMAT, _check_dataset_manifest)


def _check_dataset_manifest(manifest: dict) -> None:
    for key in ("game", "plane_shape", "num_actions", "files"):
        if key not in manifest:
            raise ValueError(f"missing key {key!r}")


def dataset_sha256(path: str | Path) -> str:
    return read_manifest(path)[1]


def load_arrays(path: Path, plane_shape: tuple[int, ...], num_actions: int) -> Arrays:
    """One NPZ file, shape-checked; anything unreadable is a DatasetError naming the file."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            planes, policy, value = (np.asarray(npz[name], dtype=np.float32) for name in ARRAY_NAMES)
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file not found") from None
    except (zipfile.BadZipFile, KeyError, ValueError, OSError, EOFError) as exc:
        raise DatasetError(f"{path}: truncated or corrupt NPZ: {exc}") from None
    n = value.shape[0] if value.ndim in (1, 2) else -1
    if planes.shape != (n, *plane_shape) or policy.shape != (n, num_actions):
        raise DatasetError(
            f"{path}: arrays do not fit the manifest: planes {planes.shape}, policy {policy.shape}, "
            f"value {value.shape}; expected (N, {', '.join(map(str, plane_shape))}), (N, {num_actions}), (N,)"
        )
    if n and not (np.isfinite(planes).all() and np.isfinite(policy).all() and np.isfinite(value).all()):
        raise DatasetError(f"{path}: non-finite values in the dataset")
    return Arrays(planes, policy, value)


def load_dataset(
    path: str | Path, expect_sha256: str | None = None, expect_game: str | None = None
) -> Dataset:
    """Verify every digest in the manifest, then load both splits."""
    path = Path(path)
    manifest, sha = read_manifest(path)
    if expect_sha256 is not None and sha != expect_sha256:
        raise DatasetError(f"{path}: dataset sha256 {sha[:12]} is not the expected {expect_sha256[:12]}")
    if expect_game is not None and manifest["game"] != expect_game:
        raise DatasetError(f"{path}: dataset is for game {manifest['game']!r}, expected {expect_game!r}")
    plane_shape = tuple(int(x) for x in manifest["plane_shape"])
    num_actions = int(manifest["num_actions"])
    for name in (TRAIN_NAME, HOLDOUT_NAME):
        if name not in manifest["files"]:
            raise DatasetError(f"{path / MANIFEST_NAME}: {name} is not listed")
    problem = verify_dir(path, sha, read_manifest)
    if problem is not None:
        raise DatasetError(problem)
    splits = {name: load_arrays(path / name, plane_shape, num_actions) for name in (TRAIN_NAME, HOLDOUT_NAME)}
    return Dataset(path, manifest, sha, splits[TRAIN_NAME], splits[HOLDOUT_NAME])
