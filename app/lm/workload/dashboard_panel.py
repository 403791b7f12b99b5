"""The dashboard's language-model panel (issue 53, item 2): each node's running GRPO (step, the
policy version its groups came from, staleness, mean reward, workers' groups, what it trains
from, its held-out curve) and the held-out reward of every evaluated generation. Pure: built
from the nodes' gossiped inventories (`lm_training`, `lm_trains_from`: lm_steps.node_status)
and the held-out summaries, so the page shows what /status and /progress say.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

Json = dict[str, Any]
RUN_KEYS = ("step", "sft_step", "policy_version", "staleness", "mean_reward", "remote_groups", "loss")
NODES_MAX = 64  # rows: a cluster's nodes, bounded as every gossiped collection
CURVE_MAX = 16  # held-out points of a run shown


def training_rows(inventories: Mapping[str, Mapping[str, Any]]) -> list[Json]:
    """One row per node that trains or says what it trains from (others only make rollouts)."""
    rows = []
    for node_id in sorted(inventories)[:NODES_MAX]:
        inv = inventories[node_id]
        run, source = inv.get("lm_training"), inv.get("lm_trains_from")
        if not isinstance(run, dict) and not isinstance(source, dict):
            continue
        run = run if isinstance(run, dict) else {}
        curve = run.get("heldout") if isinstance(run.get("heldout"), list) else []
        rows.append({"node_id": node_id, **{k: run.get(k) for k in RUN_KEYS},
                     "trains_from": source if isinstance(source, dict) else None,
                     "heldout": [p for p in curve if isinstance(p, dict)][-CURVE_MAX:]})
    return rows


def heldout_rows(summaries: Iterable[Mapping[str, Any]]) -> list[Json]:
    """[{generation, sha256, reward, low, high}] by generation, from held-out summaries (a
    cluster's decided records, or a lone node's heldout.json rows)."""
    rows = []
    for s in summaries:
        reward = s.get("reward")
        if not isinstance(reward, (int, float)) or isinstance(reward, bool):
            continue
        rows.append({"generation": s.get("generation"), "sha256": s.get("sha256"), "reward": reward,
                     "low": s.get("low"), "high": s.get("high"), "promoted": s.get("promoted")})
    return sorted(rows, key=lambda r: (r["generation"] if isinstance(r["generation"], int) else -1))
