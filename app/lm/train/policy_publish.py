"""The online trainer's newest weights for rollout workers on other nodes (issue 53, item 1).

A node that does not hold the training claim can only generate from the trainer's newest
weights if it can get them and knows which version they are. So after each optimizer step
(every `every` steps) rank 0 of a run the node launched writes them as a Hugging Face
directory named by the sha256 of its manifest, the same kind of directory a promoted model
is, and points to it from the run dir:

    <data>/lm_policies/<sha256>/   served to peers at /lm_policies/<sha256>/ (lm_mesh.py), as
                                   promoted models are at /lm_models/ (the dataset routes)
    <run>/policy.json              {"generation", "version", "sha256", "published": [[version, sha256], ...]}

The node reads the pointer into its gossiped `lm_training` (run_metrics.py), so peers learn
the version and where to fetch it within a gossip round. `published` is the trainer's own
map from sha256 to the version it stands for: a group a worker stamps with a version is
trusted only through the sha256 of the weights that made it (remote_groups.py). Only the
newest `keep` directories stay; a new run removes the ones no pointer of it names (the
previous generation's policies make groups no run will take), except where a trainer that
stays trains on (`inherited`): its last run's policies are its own earlier weights, renumbered
in the new run's versions (its candidate, the last one, is version 0 again, the ones before it
negative), so the groups workers were still making from them when the run ended are taken
within `max_staleness` steps as if no generation had ended. Directories are written under a
staging name and renamed whole; the pointer is written atomically after the rename.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from app.atomic_files import atomic_write_json
from app.lm.model_dir import write_manifest
from app.lm.train.hf_io import write_pretrained

POLICY_FILE = "policy.json"
POLICIES_DIR = "lm_policies"  # under the node's data dir


def read_policy(run_dir: str | Path | None) -> dict[str, Any] | None:
    """The run's newest published policy ({generation, version, sha256}), None when it has none."""
    if run_dir is None:
        return None
    try:
        data = json.loads((Path(run_dir) / POLICY_FILE).read_text(encoding="utf-8"))
        return {"generation": int(data["generation"]), "version": int(data["version"]), "sha256": str(data["sha256"])}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def published_versions(run_dir: str | Path) -> dict[str, int]:
    """sha256 -> version of the policies the run's pointer lists (what ranks other than 0 read)."""
    try:
        data = json.loads((Path(run_dir) / POLICY_FILE).read_text(encoding="utf-8"))
        return {str(s): int(v) for v, s in data["published"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


class PolicyPublisher:
    def __init__(self, root: str | Path, run_dir: str | Path, generation: int, model: nn.Module, tokenizer: Any,
                 *, keep: int = 4, every: int = 1, inherited: Sequence[tuple[int, str]] = ()) -> None:
        """`model` gives the directory's architecture (its config and class); the weights come
        with each call. A resumed run keeps the versions it published before its kill; a new
        run of a trainer that stays starts with `inherited` (its last run's, renumbered)."""
        self.root, self.run_dir, self.generation = Path(root), Path(run_dir), generation
        self.model, self.tokenizer, self.keep, self.every = model, tokenizer, max(1, keep), max(1, every)
        mine = self._previous() or [(int(v), str(s)) for v, s in inherited if (self.root / str(s)).is_dir()]
        self.published: list[tuple[int, str]] = mine[-self.keep:]
        self._sweep()

    def _previous(self) -> list[tuple[int, str]]:
        try:
            data = json.loads((self.run_dir / POLICY_FILE).read_text(encoding="utf-8"))
            return [(int(v), str(s)) for v, s in data["published"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    def _sweep(self) -> None:
        """Directories no pointer of this run names: another generation's, or staging copies."""
        if not self.root.is_dir():
            return
        mine = {sha for _, sha in self.published}
        for path in self.root.iterdir():
            if path.name not in mine:
                shutil.rmtree(path, ignore_errors=True)

    def versions(self) -> dict[str, int]:
        """sha256 -> the version it stands for, of the directories still published."""
        return {sha: version for version, sha in self.published}

    def carried(self, last_version: int) -> list[tuple[int, str]]:
        """What the next run of a trainer that stays inherits: this run's own policies with its
        candidate, version `last_version` here, as version 0 (not those it inherited itself:
        their groups are a whole run stale by then, and one hop keeps what to exclude bounded)."""
        return [(version - last_version, sha) for version, sha in self.published if version >= 0]

    def __call__(self, version: int, weights: Mapping[str, torch.Tensor]) -> str | None:
        """Publish `weights` as `version` (when due); the directory's sha256."""
        if version % self.every:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".staging-{secrets.token_hex(4)}"
        write_pretrained(self.model, {k: v.detach().cpu() for k, v in weights.items()}, staging, self.tokenizer)
        sha = write_manifest(staging)
        final = self.root / sha
        if final.is_dir():  # the same weights again (a step that changed nothing)
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.rename(final)
        self.published = [(v, s) for v, s in self.published if v != version] + [(version, sha)]
        dropped, self.published = self.published[:-self.keep], self.published[-self.keep:]
        atomic_write_json(self.run_dir / POLICY_FILE, {"generation": self.generation, "version": version,
                                                       "sha256": sha, "published": self.published})
        kept = {s for _, s in self.published}
        for _, old in dropped:
            if old not in kept:
                shutil.rmtree(self.root / old, ignore_errors=True)
        return sha
