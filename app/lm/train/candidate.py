"""The files of one LM training run's directory besides its checkpoints: what it was started
on (`lm_run.json`), the metrics it logged, and the candidate, a Hugging Face directory with its
manifest that appears at `<run_dir>/candidate` whole and verified, or not at all.

    stage_candidate   (collective) whole weights -> `.staging-candidate-*`, manifest, verified
    write result.json (the caller, atomically; it names the staged manifest's sha256)
    publish_candidate one rename into place

result.json is written before the rename, so a run is finished exactly when the candidate
verifies against the sha256 its result.json names (`finished`); a run killed between the two
steps just writes both again on its next start.

With LoRA the candidate holds the MERGED weights (a plain model of the base architecture:
what the mesh promotes, what every engine loads, what the next generation starts from), and
the adapter alone is written beside it, `<run_dir>/adapter/` (peft's layout), first.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

from app.atomic_files import atomic_write_json, fsync_dir
from app.lm.lora import base_model, is_lora, merged_weights, save_adapter
from app.lm.train import dcp_io
from app.lm.train.backend import TrainingBackend
from app.lm.train.hf_io import write_pretrained
from app.lm.model_dir import (
    ModelDirError,
    read_model_manifest,
    verify_model_dir,
    write_manifest,
)

RUN_NAME = "lm_run.json"  # what a run dir was started on: a restart on other inputs is refused
ADAPTER_NAME = "adapter"  # <run_dir>/adapter/: a LoRA run's adapter (the candidate is merged)


def stage_candidate(backend: TrainingBackend, tokenizer: Any, run_dir: Path, name: str) -> tuple[Path, str] | None:
    """Every rank calls it (the weights are gathered from the shards); rank 0 returns the
    verified staging directory and its sha256, the other ranks None."""
    weights = dcp_io.full_state(backend.model, None, rank0_only=backend.world_size > 1)["model"]
    if backend.rank != 0:
        return None
    for stale in [*run_dir.glob(f".staging-{name}-*"), *run_dir.glob(f".staging-{ADAPTER_NAME}-*")]:
        shutil.rmtree(stale, ignore_errors=True)
    if is_lora(backend.model):
        adapter = run_dir / f".staging-{ADAPTER_NAME}-{secrets.token_hex(4)}"
        save_adapter(backend.model, weights, adapter)
        fsync_dir(adapter)
        publish_candidate(adapter, run_dir / ADAPTER_NAME)
    staging = run_dir / f".staging-{name}-{secrets.token_hex(4)}"
    staging.mkdir(parents=True)
    write_pretrained(base_model(backend.model), merged_weights(backend.model, weights), staging, tokenizer)
    sha = write_manifest(staging)
    problem = verify_model_dir(staging, sha)
    if problem is not None:
        raise ModelDirError(f"candidate failed verification right after writing: {problem}")
    fsync_dir(staging)
    return staging, sha


def publish_candidate(staging: Path, final: Path) -> None:
    """Rename the staged directory to `final` (an older one there is moved aside first)."""
    if final.exists():
        old = final.with_name(f".old-{final.name}-{secrets.token_hex(4)}")
        os.replace(final, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(staging, final)
    fsync_dir(final.parent)


def finished(candidate: Path, result_file: Path) -> bool:
    """True when result.json names the candidate's manifest and the candidate verifies."""
    try:
        sha = json.loads(result_file.read_text(encoding="utf-8"))["candidate_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return isinstance(sha, str) and candidate.is_dir() and verify_model_dir(candidate, sha) is None


def parent_sha256(parent: Path) -> str:
    """The manifest sha256 of a verified parent directory; ModelDirError names what is wrong."""
    problem = verify_model_dir(parent)
    if problem is not None:
        raise ModelDirError(problem)
    return read_model_manifest(parent)[1]


def claim_run_dir(run_dir: Path, identity: dict[str, Any]) -> str | None:
    """Rank 0: record what this run dir trains on, or say why a restart may not reuse it."""
    path = run_dir / RUN_NAME
    if path.is_file():
        try:
            before = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as exc:
            return f"{path}: unreadable ({exc})"
        changed = {k: (before.get(k), v) for k, v in identity.items() if before.get(k) != v}
        return f"{path}: this run dir was started on other inputs {changed}; use a new run dir" if changed else None
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, identity, indent=2)
    return None


def last_logged(run_dir: Path, phase: str) -> dict[str, Any]:
    """The newest metrics line of `phase` (a run resumed after its last step has no history)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    for line in reversed(lines):
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a line torn by a kill
        if entry.get("phase") == phase:
            return entry
    return {}
