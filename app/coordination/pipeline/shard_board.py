"""What a node gossips about spread gauntlets: the request of the candidate it trained
(`gauntlet_request`) and the shard results it played (`gauntlet_results`: item id -> tally and
compact games). Results are kept in a small JSON file so a restarted node still publishes what
it played, and they stay published until their generation is decided (then dropped; only the
newest few generations are kept at all)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.atomic_files import atomic_write_json
from app.coordination.pipeline.gauntlet_plan import REQUEST_KEY, RESULTS_KEY, GauntletRequest
from app.log import get_logger

if TYPE_CHECKING:  # the board only stores a played shard; importing its module loads torch
    from app.games.train.gauntlet_shard import ShardResult

log = get_logger(__name__)
KEEP_GENERATIONS = 3


class ShardBoard:
    """This node's part of the spread gauntlets, as gossiped. Thread-safe: the inventory is
    built in a worker thread while daemons change the board on the event loop."""

    def __init__(self, path: Path, keep_generations: int = KEEP_GENERATIONS) -> None:
        self.path = path
        self.keep_generations = keep_generations
        self._lock = threading.Lock()
        self._request: GauntletRequest | None = None
        self._results: dict[str, dict[str, Any]] = self._load()

    def _load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            data = json.loads(self.path.read_text())
            return {str(k): dict(v) for k, v in data.items() if isinstance(v, dict) and "generation" in v}
        except (OSError, ValueError, AttributeError) as exc:
            log.error("gauntlet_results_unreadable", path=str(self.path), error=str(exc))
            return {}  # only republished results are lost: the claimant replays what it misses

    @property
    def request(self) -> GauntletRequest | None:
        return self._request

    def set_request(self, request: GauntletRequest | None) -> None:
        with self._lock:
            self._request = request

    def publish(self, generation: int, result: ShardResult) -> None:
        with self._lock:
            self._results[result.shard_id] = {**result.to_json(), "generation": generation}
            self._prune_locked(set())
            self._save()

    def results(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            return dict(self._results)

    def prune(self, decided: set[int]) -> None:
        """Drop results of decided generations, and all but the newest few generations."""
        with self._lock:
            if self._prune_locked(decided):
                self._save()

    def _prune_locked(self, decided: set[int]) -> bool:
        generations = sorted({int(r["generation"]) for r in self._results.values()})
        keep = set(generations[-self.keep_generations:]) - decided
        kept = {k: r for k, r in self._results.items() if int(r["generation"]) in keep}
        changed = len(kept) != len(self._results)
        self._results = kept
        return changed

    def _save(self) -> None:
        atomic_write_json(self.path, self._results)

    def inventory(self) -> dict[str, Any]:
        with self._lock:
            return {REQUEST_KEY: None if self._request is None else self._request.to_json(),
                    RESULTS_KEY: dict(self._results)}
