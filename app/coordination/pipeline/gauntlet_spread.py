"""The claimant's gauntlet in a cluster: baseline games spread over the nodes, SPRT at home.

    1. install the candidate in the model store (peers fetch it by sha256) and gossip a
       `gauntlet_request`; the leader turns it into `gauntlet:generation-<g>-<sha12>-<baseline>-<k>` items
    2. play the SPRT match against the current best here (it is sequential: it cannot be cut)
    3. collect shard results from gossip; while some are missing, claim and play shards here
       too, and once `shard_wait_s` has passed play the missing ones here without a claim
    4. merge (each game once, by uid), record every game in this node's registry, refit Elo

The report has the same shape as a lone node's, so the promotion gates, Elo and /progress
read it unchanged.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING

from app.coordination.pipeline.gauntlet_plan import RESULTS_KEY, GauntletRequest, Shard, shards_of
from app.coordination.pipeline.shard_worker import claim_shard, play_claimed_shard
from app.coordination.sync import install_model, model_file
from app.games.search.player_specs import net_spec
from app.db.registry import ModelRegistry
from app.log import get_logger
from app.games.train.gauntlet import (
    GauntletReport, GauntletStopped, OpponentResult, rated_anchor, recompute_ratings, run_gauntlet,
)
from app.games.train.gauntlet_baselines import Baseline, anchor_player
from app.games.train.gauntlet_shard import (
    MergedGauntlet, ShardResult, merge_shards, play_shard, shard_players, shard_refusal,
)

if TYPE_CHECKING:
    from app.coordination.pipeline.context import PipelineContext
    from app.coordination.pipeline.state import PipelineState

log = get_logger(__name__)
POLL_S = 0.5


def build_request(pipe: "PipelineContext", state: "PipelineState", baselines: list[Baseline]) -> GauntletRequest:
    """Each baseline with its own game count (gauntlet_baselines.planned_baselines: the gate's
    and the fixed anchor's), so the shard plan cuts each match at its own size."""
    cfg = pipe.settings.gauntlet
    return GauntletRequest(
        generation=state.generation, candidate_sha256=str(state.candidate_sha256), claimant=pipe.node_id,
        net_simulations=cfg.net_simulations, shard_games=cfg.shard_games,
        baselines={b.kind: (b.spec, b.games) for b in baselines if b.games > 0})


class ShardCollector:
    """The shard results of one request, taken from gossip (any node's, dead ones too: what a
    node published stays true) and from this node's board; each checked before it counts."""

    def __init__(self, pipe: "PipelineContext", request: GauntletRequest, candidate: str,
                 opponents: dict[str, str]) -> None:
        self.pipe = pipe
        self.request = request
        self.candidate = candidate
        self.opponents = opponents  # kind -> opponent player name
        self.shards = {s.item_id: s for s in shards_of(request)}
        self.results: dict[str, ShardResult] = {}
        self._refused: set[tuple[str, str]] = set()

    def gather(self) -> list[Shard]:
        """Take every acceptable result now visible; the shards still missing, in order."""
        cluster = self.pipe.cluster
        published = [cluster.gauntlet.results()]
        published += [s.inventory.get(RESULTS_KEY) for s in cluster.node.cluster_view().nodes.values()]
        for results in published:
            if not isinstance(results, dict):
                continue
            for item_id, data in results.items():
                shard = self.shards.get(item_id)
                if shard is None or item_id in self.results:
                    continue
                self._consider(shard, data)
        return [s for iid, s in self.shards.items() if iid not in self.results]

    def _consider(self, shard: Shard, data: object) -> None:
        try:
            result = ShardResult.from_json(data)  # type: ignore[arg-type]
            why = None if result.shard_id == shard.item_id else f"names shard {result.shard_id!r}"
            why = why or shard_refusal(result, self.candidate, self.request.candidate_sha256,
                                       self.opponents[shard.kind], shard.games + shard.games % 2)
        except (KeyError, ValueError, TypeError) as exc:
            result, why = None, f"malformed: {exc!r}"
        if why is None and result is not None:
            self.results[shard.item_id] = result
            return
        played_by = data.get("played_by", "?") if isinstance(data, dict) else "?"
        if (shard.item_id, str(played_by)) not in self._refused:  # log each bad copy once
            self._refused.add((shard.item_id, str(played_by)))
            log.warning("gauntlet_shard_refused", item=shard.item_id, played_by=played_by, why=why)

    def merged(self, best: OpponentResult | None) -> MergedGauntlet:
        baselines = [(kind, self.opponents[kind]) for kind in self.request.baselines]
        return merge_shards(self.candidate, baselines,
                            [(self.shards[iid].kind, r) for iid, r in sorted(self.results.items())], best)


async def spread_gauntlet(pipe: "PipelineContext", state: "PipelineState", baselines: list[Baseline],
                          workers: int, should_stop: Callable[[], bool]) -> GauntletReport:
    """The gauntlet of this node's trained candidate with its baseline games spread over the cluster."""
    started = time.monotonic()
    cfg = pipe.settings.gauntlet
    sha = str(state.candidate_sha256)
    path = await asyncio.to_thread(install_model, state.candidate_path, pipe.paths.models_dir, sha)
    request = build_request(pipe, state, baselines)
    candidate = net_spec(path, request.net_simulations, pipe.settings.search.c_puct)
    opponents = {kind: shard_players(path, spec, pipe.settings, request.net_simulations)[1].name
                 for kind, (spec, _) in request.baselines.items()}
    collector = ShardCollector(pipe, request, candidate.name, opponents)
    pipe.cluster.gauntlet.prune(set(pipe.cluster.generations.records))  # a node without the shard daemon prunes here
    pipe.cluster.gauntlet.set_request(request)
    log.info("gauntlet_spread", generation=state.generation, shards=len(collector.shards))
    match_id, best = uuid.uuid4().hex[:16], None
    if state.best_path is not None:  # the SPRT vs the best, here, while peers play the shards
        sprt = await asyncio.to_thread(
            run_gauntlet, path, [], state.best_path, pipe.settings, pipe.paths.registry_db,
            workers=workers, seed=state.generation, should_stop=should_stop)
        match_id, best = sprt.match_id, sprt.result("best")
    await collect_shards(pipe, collector, started + cfg.shard_wait_s, workers, should_stop)
    merged = collector.merged(best)
    ratings = await asyncio.to_thread(_record, pipe, merged, candidate.game)
    pipe.cluster.gauntlet.set_request(None)  # every shard is in: the leader may drop its items
    played_by = sorted({r.played_by for r in collector.results.values()})
    log.info("gauntlet_merged", generation=state.generation, shards=len(collector.results), played_by=played_by)
    report = GauntletReport(match_id, candidate.name, sha, merged.results, ratings,
                            anchor=rated_anchor(ratings, anchor_player(pipe.settings)))
    report.elapsed_s = time.monotonic() - started
    return report


async def collect_shards(pipe: "PipelineContext", collector: ShardCollector, deadline: float, workers: int,
                         should_stop: Callable[[], bool]) -> None:
    """Until every shard has a result: take published ones, claim and play pending ones, and
    after `deadline` (monotonic) play what is still missing here, claimed elsewhere or not."""
    request = collector.request
    while missing := collector.gather():
        if should_stop():
            raise GauntletStopped("gauntlet stopped while collecting shards")
        claim = await claim_shard(pipe.cluster)
        if claim is not None:
            await play_claimed_shard(pipe, claim, workers, should_stop)
            continue
        if time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            continue
        shard = missing[0]
        log.info("gauntlet_shard_timed_out", item=shard.item_id, played_here=True)
        result = await asyncio.to_thread(
            play_shard, model_file(pipe.paths.models_dir, request.candidate_sha256), shard.baseline, shard.games, shard.seed,
            shard.item_id, pipe.settings, pipe.paths.registry_db, request.net_simulations, workers,
            pipe.node_id, should_stop)
        pipe.cluster.gauntlet.publish(request.generation, result)
        collector.results[shard.item_id] = result  # played here: counted even if a peer's copy was refused


def _record(pipe: "PipelineContext", merged: MergedGauntlet, game: str) -> list:
    """Every shard game into this node's registry (idempotent by uid), then the Elo refit."""
    with ModelRegistry(pipe.paths.registry_db) as registry:
        registry.add_match_games(g.match_game(g.uid.rpartition("#")[0], game) for g in merged.games)
        return recompute_ratings(registry, pipe.settings.gauntlet.net_simulations, anchor_player(pipe.settings))
