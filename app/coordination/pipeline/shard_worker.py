"""Gauntlet shards on every node: claim one, fetch the candidate, play it, publish the result.

Results are published on the node's `ShardBoard` (shard_board.py), which gossip carries.

The shard worker daemon claims `gauntlet` items (POST /work/claim, kinds ["gauntlet"]) while
its own node has no generation of its own in flight; the claimant plays shards through the
same `play_claimed_shard` from its gauntlet (app/coordination/pipeline/gauntlet_spread.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.coordination.daemons.events import EventType
from app.coordination.pipeline.context import wait_for_wake, wake_on
from app.coordination.pipeline.gauntlet_plan import GAUNTLET_KIND
from app.coordination.p2p.worker import Claim, WorkClient
from app.coordination.sync import ModelFetchError, fetch_from_mesh
from app.log import get_logger
from app.games.train.gauntlet import GauntletStopped
from app.games.train.gauntlet_shard import ShardResult, play_shard
from app.coordination.pipeline.runner_settings import ClaimPolled
from app.coordination.pipeline.state import Stage
from app.coordination.pipeline.steps import Cluster

if TYPE_CHECKING:
    from app.coordination.daemons.daemon_registry import DaemonContext
    from app.coordination.pipeline.context import PipelineContext

log = get_logger(__name__)


async def claim_shard(cluster: Cluster) -> Claim | None:
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


async def gauntlet_shards_daemon(pipe: "PipelineContext", ctx: "DaemonContext[ClaimPolled]") -> None:
    """Plays other nodes' gauntlet shards whenever this node has no generation of its own in
    flight (the claimant plays its shards from its gauntlet); nothing to do on a lone node."""
    wake = wake_on(ctx, EventType.LEADER_ELECTED)  # a new leader cut the shards anew
    ctx.mark_healthy()
    while pipe.cluster is not None and not ctx.stopping.is_set():
        pipe.cluster.gauntlet.prune(set(pipe.cluster.generations.records))
        claim = await claim_shard(pipe.cluster) if pipe.state.stage is Stage.COLLECTING else None
        if claim is not None:
            await play_claimed_shard(pipe, claim, pipe.settings.gauntlet.workers, ctx.stopping.is_set)
            ctx.mark_healthy()
            continue
        ctx.mark_healthy()
        if await wait_for_wake(ctx, wake, ctx.settings.poll_s):
            return
    await ctx.stopping.wait()
