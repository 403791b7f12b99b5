"""Gauntlet shards on every node: claim one, fetch the candidate, play it, publish the result.

What a node gossips about spread gauntlets lives on its `ShardBoard`: the request of the
candidate it trained (`gauntlet_request`) and the shard results it played
(`gauntlet_results`: item id -> tally and compact games). Results are kept in a small JSON
file so a restarted node still publishes what it played, and they stay published until
their generation is decided (then dropped; only the newest few generations are kept at all).

The shard worker daemon claims `gauntlet` items (POST /work/claim, kinds ["gauntlet"]) while
its own node has no generation of its own in flight; the claimant plays shards through the
same `play_claimed_shard` from its gauntlet (app/coordination/gauntlet_spread.py).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.atomic_files import atomic_write_json
from app.coordination.gauntlet_plan import GAUNTLET_KIND, REQUEST_KEY, RESULTS_KEY, GauntletRequest
from app.coordination.p2p.worker import Claim, WorkClient
from app.coordination.sync import ModelFetchError, fetch_from_mesh
from app.log import get_logger
from app.training.gauntlet import GauntletStopped
from app.training.gauntlet_shard import ShardResult, play_shard
from app.training.pipeline_state import Stage

if TYPE_CHECKING:
    from app.coordination.cluster_pipeline import ClusterPipeline
    from app.coordination.daemon_registry import DaemonContext
    from app.coordination.pipeline_context import PipelineContext

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


async def claim_shard(cluster: "ClusterPipeline") -> Claim | None:
    return await cluster.work_client().claim(kinds=[GAUNTLET_KIND])


async def _renew_until_lost(work: WorkClient, claim: Claim, lost: asyncio.Event) -> None:
    await work.keep_alive(claim)
    lost.set()


async def play_claimed_shard(pipe: "PipelineContext", claim: Claim, workers: int,
                             should_stop: Callable[[], bool]) -> ShardResult | None:
    """Play a claimed gauntlet item, publish its result, complete the claim; None when it could
    not be played (the claim is failed, so the leader hands it out again)."""
    cluster = pipe.cluster
    work = cluster.work_client()
    lost = asyncio.Event()
    renewer = asyncio.create_task(_renew_until_lost(work, claim, lost))
    try:
        payload = claim.item.payload
        generation, sha = int(payload["generation"]), str(payload["candidate_sha256"])
        path = await fetch_from_mesh(cluster.node, sha, pipe.paths.models_dir)  # at once when installed
        result = await asyncio.to_thread(
            play_shard, path, str(payload["baseline"]), int(payload["games"]), int(payload["seed"]),
            claim.item.item_id, pipe.settings, pipe.paths.registry_db, int(payload["net_simulations"]),
            workers, pipe.node_id, lambda: should_stop() or lost.is_set())
    except GauntletStopped:
        await work.fail(claim, "stopped before the shard was played")
        return None
    except ModelFetchError as exc:
        log.warning("gauntlet_shard_model_missing", item=claim.item.item_id, error=str(exc))
        await work.fail(claim, str(exc)[:2000])
        return None
    except (KeyError, ValueError, TypeError) as exc:
        log.error("gauntlet_shard_bad_item", item=claim.item.item_id, error=repr(exc))
        await work.fail(claim, f"bad gauntlet item: {exc!r}")
        return None
    finally:
        renewer.cancel()
    cluster.gauntlet.publish(generation, result)  # published first: the result outlives a lost claim
    await work.complete(claim, {"wins": result.wins, "draws": result.draws, "losses": result.losses})
    log.info("gauntlet_shard_played", item=claim.item.item_id, wins=result.wins, draws=result.draws,
             losses=result.losses)
    return result


async def gauntlet_shards_daemon(pipe: "PipelineContext", ctx: "DaemonContext") -> None:
    """Plays other nodes' gauntlet shards whenever this node has no generation of its own in
    flight (the claimant plays its shards from its gauntlet); nothing to do on a lone node."""
    ctx.mark_healthy()
    while pipe.cluster is not None and not ctx.stopping.is_set():
        pipe.cluster.gauntlet.prune(set(pipe.cluster.log.records))
        claim = await claim_shard(pipe.cluster) if pipe.state.stage is Stage.COLLECTING else None
        if claim is not None:
            await play_claimed_shard(pipe, claim, int(ctx.settings["workers"]), ctx.stopping.is_set)
            ctx.mark_healthy()
            continue
        ctx.mark_healthy()
        if await ctx.sleep(float(ctx.settings["poll_s"])):
            return
    await ctx.stopping.wait()
