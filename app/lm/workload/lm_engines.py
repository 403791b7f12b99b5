"""A node's inference engines (`lm.engines`), built once and kept for the node's life: the
first generates self-play's rollouts; every one is synced to the best model when self-play
first needs it and at each promotion (lm_models.ModelDirs.switched), through the one sync
path (app/lm/rollout/weight_sync.py).

The weight version of a model is its generation (0: the seeded random init, written once to
`<data>/lm_init_model/` so that a server can load it too). An engine's version is what it
reported after its last load; an engine whose sync failed is out of service, shown so in
/status with the error, and self-play generates nothing with it (so nothing of it is stored)
until a sync succeeds: self-play tries again at most every `RETRY_S`.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from app.config.lm import LMConfig
from app.config.paths import NodePaths
from app.lm.causal_lm import load_model, save_model
from app.lm.rollout.engine import Engine, WeightUpdate
from app.lm.rollout.engine_config import build_engine
from app.lm.rollout.weight_sync import WeightSyncError, start_engines, sync_engines
from app.lm.setup import initial_model, model_at
from app.log import get_logger

log = get_logger(__name__)
RETRY_S = 10.0
INIT_MODEL_DIR = "lm_init_model"
INIT_ID = "init"


class NodeEngines:
    def __init__(self, lm: LMConfig, paths: NodePaths) -> None:
        self.lm, self.paths = lm, paths
        self.engines: list[Engine] = []
        self.serving: dict[str, str | None] = {}  # engine name -> sha256 of the model it was last synced to
        self._lock = threading.Lock()
        self._next_try = 0.0

    # -- self-play's side (a worker thread) ---------------------------------------------------
    def rollout_engine(self, best_path: str | None, best_generation: int, best_sha256: str | None,
                       tokenizer: Any) -> Engine | None:
        """The first engine, holding the best weights; None while it is out of service (and a
        new sync, tried at most every RETRY_S, failed too)."""
        with self._lock:
            if not self.engines:
                self._build(best_path, best_generation, best_sha256, tokenizer)
            behind = [e for e in self.engines if not e.in_service or e.weight_version != best_generation
                      or self.serving.get(e.name) != best_sha256]
            if behind and time.monotonic() >= self._next_try:
                path = Path(best_path) if best_path else self._init_dir(tokenizer)
                try:
                    asyncio.run(self._sync(path, best_generation, best_sha256, behind))
                except WeightSyncError:
                    self._next_try = time.monotonic() + RETRY_S
            first = self.engines[0]
            ready = first.in_service and first.weight_version == best_generation
            return first if ready and self.serving[first.name] == best_sha256 else None

    def policy_server(self, path: Path, version: int, sha256: str, best: tuple[str | None, int, str | None],
                      tokenizer: Any) -> Engine | None:
        """A rollout worker's engine for the trainer's policy at `path` on a node whose first engine
        is a server (SGLang, vLLM; `first_is_server`): that server, synced to the policy by the one
        sync path (its weights are the policy's until self-play plays the best again, which syncs
        it back: `serving` says which model it holds). None while the server is out of service (a
        failed sync, shown in /status; tried again at most every RETRY_S)."""
        with self._lock:
            if not self.engines:
                self._build(*best, tokenizer)
            first = self.engines[0]
            if first.in_service and self.serving.get(first.name) == sha256 and first.weight_version == version:
                return first
            if time.monotonic() < self._next_try:
                return None
            try:
                asyncio.run(self._sync(path, version, sha256, [first]))
            except WeightSyncError as exc:
                log.warning("lm_policy_sync_failed", engine=first.name, version=version, failures=exc.failures)
                self._next_try = time.monotonic() + RETRY_S
                return None
            return first

    @property
    def first_is_server(self) -> bool:
        """Self-play's engine is a server: a rollout worker plays the trainer's policy on it too."""
        return self.lm.engines[0].kind != "in_process"

    def _build(self, best_path: str | None, best_generation: int, best_sha256: str | None, tokenizer: Any) -> None:
        """The in-process engine is built holding the best weights; the servers' are unknown."""
        engines = []
        for cfg in self.lm.engines:
            model = model_at(self.lm.model, best_path, tokenizer) if cfg.kind == "in_process" else None
            engines.append(build_engine(cfg, model, tokenizer, weight_version=best_generation))
        asyncio.run(start_engines([e for e in engines if e.kind != "in_process"]))
        self.engines = engines
        self.serving = {e.name: best_sha256 if e.kind == "in_process" else None for e in engines}

    def _init_dir(self, tokenizer: Any) -> Path:
        """The generation-0 model as a directory (written once, renamed whole)."""
        final = self.paths.data_dir / INIT_MODEL_DIR
        if not (final / "config.json").is_file():
            staging = final.with_name(f".staging-{INIT_MODEL_DIR}")
            shutil.rmtree(staging, ignore_errors=True)
            save_model(initial_model(self.lm.model, tokenizer), tokenizer, staging)
            shutil.rmtree(final, ignore_errors=True)
            staging.rename(final)
        return final

    # -- the promotion's side (the node's event loop) ------------------------------------------
    async def switched(self, path: Path, generation: int, sha256: str) -> None:
        """Every engine loads the new model; a failure is logged and shown in /status. Before
        self-play built them there is nothing to load: it syncs them to the best itself."""
        if not self.engines:
            return
        try:
            await self._sync(path, generation, sha256, self.engines)
        except WeightSyncError as exc:
            log.warning("weight_sync_failed", generation=generation, failures=exc.failures)

    async def _sync(self, path: Path, version: int, sha256: str | None, engines: list[Engine]) -> None:
        update = WeightUpdate(version=version, path=path, tensors=lambda: load_model(path).state_dict())
        try:
            await sync_engines(engines, update)
        except WeightSyncError as exc:
            for name in exc.synced:
                self.serving[name] = sha256
            raise
        for e in engines:
            self.serving[e.name] = sha256

    # -- /status -------------------------------------------------------------------------------
    def status(self, best_generation: int, best_sha256: str | None) -> dict[str, dict[str, Any]]:
        if not self.engines:  # before self-play's first batch: what it will start from
            return {e.name: {"kind": e.kind, "sync": e.sync_mode, "weight_version": best_generation,
                             "sha256": best_sha256, "in_service": None} for e in self.lm.engines}
        return {e.name: {"kind": e.kind, "sync": e.sync_mode, "weight_version": e.weight_version,
                         "sha256": self.serving.get(e.name), "in_service": e.in_service,
                         **({"error": e.last_error} if e.last_error else {})} for e in self.engines}
