"""The settings each pipeline daemon takes in daemons.yaml, typed, with their one default.

A default lives here and nowhere else: daemons.yaml (and a bench or test file) names a key
only to change it. Worker counts are not runner settings: they belong to the node config
(`selfplay.workers`, `gauntlet.workers`), which the one-purpose scripts read too.

`poll_s` is each daemon's safety net, not its trigger: events wake the daemons (the map is
in docs/ARCHITECTURE.md); the poll only catches a wake-up lost to a restart in between.
"""

from __future__ import annotations

from pydantic import Field

from app.config.base import StrictModel

SAFETY_NET_POLL_S = 10.0


class Polled(StrictModel):
    poll_s: float = Field(SAFETY_NET_POLL_S, gt=0, le=3600)


class SelfplaySettings(StrictModel):
    batch_games: int = Field(64, ge=1)  # games per self-play call (the NEW_ITEMS_AVAILABLE granularity; lm: lm.rollout.batch_groups)
    simulations: int = Field(0, ge=0)  # 0: search.simulations of the node config
    pause_while_evaluating: bool = True  # two cores: leave them to the gauntlet
    # seconds of rest after each batch: 0 keeps a core playing; a machine shared with other
    # work (or a test of the mesh, where games are only a means) leaves the CPU to the stages
    # that wait on it, and the rest ends at once on stop
    rest_s: float = Field(0.0, ge=0, le=3600)


class ExportSettings(Polled):
    min_new_games: int = Field(400, ge=1)  # new games since the last dataset that start a generation
    sync_budget_s: float = Field(60.0, gt=0)  # a claimant's pull of the games it lacks, at most


class TrainSettings(Polled):
    max_failures: int = Field(5, ge=1)  # failed runs of one generation before the daemon gives up


class ClaimPolled(StrictModel):
    """Daemons that claim other nodes' work items; a claim is a cheap request, so poll faster."""

    poll_s: float = Field(2.0, gt=0, le=3600)
