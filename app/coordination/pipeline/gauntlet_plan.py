"""A gauntlet request and its shards: pure, so every leader cuts the same request the same way.

The node that trained a candidate gossips a request (`gauntlet_request` in its inventory):
the generation, the candidate's sha256, and per baseline the games to play. Cutting it into
shards is a pure function of the request, so the item ids, game counts and seeds do not
depend on which leader schedules them or when, and a shard result published under an item
id means one and the same slice of one match everywhere.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.coordination.p2p.work_rules import item_id

GAUNTLET_KIND = "gauntlet"  # claimed with POST /work/claim, kinds ["gauntlet"]
REQUEST_KEY = "gauntlet_request"  # inventory key of the claimant's request
RESULTS_KEY = "gauntlet_results"  # inventory key of a node's published shard results
MAX_SHARDS = 256  # a request asking for more is refused (gossip must stay small)


@dataclass(frozen=True)
class Shard:
    item_key: str  # generation-<g>-<candidate sha256[:12]>-<baseline>-<k>
    kind: str  # the baseline's kind, as in the report ('random', 'heuristic', ...)
    baseline: str  # player spec text with its parameters, e.g. 'heuristic:2'
    games: int
    seed: int

    @property
    def item_id(self) -> str:
        return item_id(GAUNTLET_KIND, self.item_key)


@dataclass(frozen=True)
class GauntletRequest:
    generation: int
    candidate_sha256: str
    claimant: str
    net_simulations: int  # the candidate's search budget, fixed by the claimant
    shard_games: int
    baselines: dict[str, tuple[str, int]] = field(default_factory=dict)  # kind -> (spec text, games)

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "candidate_sha256": self.candidate_sha256, "claimant": self.claimant,
                "net_simulations": self.net_simulations, "shard_games": self.shard_games,
                "baselines": {k: {"spec": s, "games": g} for k, (s, g) in self.baselines.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "GauntletRequest":
        """Raises ValueError/KeyError/TypeError on a malformed request (gossip is untrusted)."""
        baselines = {str(k): (str(v["spec"]), int(v["games"])) for k, v in dict(data["baselines"]).items()}
        req = cls(int(data["generation"]), str(data["candidate_sha256"]), str(data["claimant"]),
                  int(data["net_simulations"]), int(data["shard_games"]), baselines)
        if req.shard_games < 1 or any(g < 0 for _, g in baselines.values()):
            raise ValueError("shard_games must be >= 1 and games >= 0")
        size = max(2, req.shard_games + req.shard_games % 2)
        if sum(-(-g // size) for _, g in baselines.values()) > MAX_SHARDS:
            raise ValueError(f"more than {MAX_SHARDS} shards")
        return req


def split_games(total: int, shard_games: int) -> list[int]:
    """Shard sizes summing to `total`; even sizes (rounded up), so each shard plays whole
    opening pairs with the candidate on each side once, as the unsharded match does."""
    size = max(2, shard_games + shard_games % 2)
    sizes = [size] * (total // size)
    if total % size:
        sizes.append(total % size)
    return sizes


def shard_seed(candidate_sha256: str, kind: str, index: int) -> int:
    """Distinct per shard (so openings differ across shards), the same on every node."""
    digest = hashlib.sha256(f"{candidate_sha256}:{kind}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def shards_of(request: GauntletRequest) -> list[Shard]:
    return [
        # the candidate in the key: after a lost claim another node's candidate of the same
        # generation gets fresh items, not the finished ones of the first
        Shard(f"generation-{request.generation}-{request.candidate_sha256[:12]}-{kind}-{k}", kind, spec, games,
              shard_seed(request.candidate_sha256, kind, k))
        for kind, (spec, total) in request.baselines.items()
        for k, games in enumerate(split_games(total, request.shard_games))
    ]
