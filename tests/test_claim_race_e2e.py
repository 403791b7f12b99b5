"""A lost training claim in the real pipeline, and two claimants racing to decide one generation.

Three real nodes, every mesh link through a proxy (tests/fault_proxy.py). n2 is the one voter,
so it leads throughout, and trains nothing (its self-play, export, train, gauntlet and promote
daemons are disabled): n0 and n1 are the only claimants and every decision they propose crosses
a proxy to the leader.

1. The first claimant C1 trains generation 1 and sends its decision to the leader; the proxy
   holds that request, and the test pauses C1 (SIGSTOP of its whole process group) past the
   claim TTL: its renewals stop, the claim lapses, the leader gives the generation to C2.
2. Then the proxy lets C1's decision through: the leader refuses it, 409 "stale claim", and
   C1, resumed, drops the generation (its candidate is recorded as not committed).
3. C2 trains the generation and proposes: committed (200).

So generation 1 is decided exactly once (one `generation_committed` on the leader), one model
won the race, the other got 409, and every node, C1 included, ends with C2's record.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import threading

import pytest
from aiohttp import web

from app.config.mesh import PROFILES
from app.db.registry import ModelRegistry, ModelStatus
from tests.fault_proxy import LinkProxy, Passing
from tests.orchestrator_helpers import (
    SMALL_DAEMONS,
    TINY_CONFIG,
    NodeFiles,
    leader_of,
    nodes_running,
    start_node,
    tiny_selfplay,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
LEADER = "n2"
CONFIG = {**TINY_CONFIG,
          # a claim lapses 10 s after its last renewal: long for a busy CPU to lapse by accident,
          # short for the paused claimant to lapse on purpose
          "mesh": {"timing": {**PROFILES["fast"].model_dump(), "claim_ttl": 10.0, "request_timeout": 3.0},
                   # the held decision is released past the claim TTL, so more than the default
                   # 10 s after it was signed: a wider freshness window lets it reach the claim
                   # check this test is about (with 10 s it is refused earlier, 401 "clock")
                   "limits": {"clock_window_s": 60.0}}}
WORKER_DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(16),
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5, "sync_budget_s": 5}},
}}
# The leader: mesh, work queue and decisions only (the export spec keeps its threshold for scheduling).
LEADER_DAEMONS = {**WORKER_DAEMONS, "daemons": {
    name: {**spec, "enabled": False} if name in ("selfplay", "export", "train", "gauntlet", "promote") else spec
    for name, spec in WORKER_DAEMONS["daemons"].items()}}


class DecisionRace:
    """Proxy hooks: hold the first decision for generation 1 until the leader has given the
    generation's claim to the other node (within the signature window of the held request)."""

    def __init__(self) -> None:
        self.first: str | None = None  # C1
        self.held = threading.Event()  # C1's decision is waiting in the proxy
        self.release: asyncio.Event | None = None  # set on the proxy's loop
        self.answers: dict[str, list[tuple[int, dict]]] = {}  # claimant -> leader's answers to its decisions
        self.claimed_by: str | None = None  # who the leader gave generation 1 to after C1's lapse

    async def before(self, src: str, dst: str, path: str, body: bytes) -> None:
        if path != "/pipeline/decision" or json.loads(body)["record"]["generation"] != 1:
            return
        if self.first is None:
            self.first = src
            self.release = asyncio.Event()
            self.held.set()
        if src == self.first and self.release is not None:
            await self.release.wait()  # until the other claimant holds the generation's claim

    def after(self, p: Passing) -> web.Response | None:
        if p.path == "/pipeline/decision" and p.status:
            self.answers.setdefault(p.src, []).append((p.status, json.loads(p.answer)))
        if (p.path == "/work/claim_training" and p.status == 200 and self.release is not None
                and p.src != self.first and b"training:generation-1" in p.answer):
            self.claimed_by = p.src
            self.release.set()
        return None


def decided(files: NodeFiles) -> dict | None:
    path = files.data_dir / "generations.json"
    records = json.loads(path.read_text()) if path.exists() else []
    return next((g for g in records if g["generation"] == 1), None)


def stage(files: NodeFiles) -> tuple[int, str]:
    state = files.state()
    return state.get("generation", 1), state.get("stage", "collecting")


@pytest.mark.timeout(1500)  # generous bounds: two trainings of one generation on two busy cores
def test_a_lapsed_claimant_loses_the_race_and_generation_1_is_decided_once(tmp_path) -> None:
    env = {"MESH_SECRET": secrets.token_hex(16)}
    nodes = {nid: write_node_files(tmp_path / nid, nid, CONFIG, LEADER_DAEMONS if nid == LEADER else WORKER_DAEMONS)
             for nid in IDS}
    race = DecisionRace()
    procs: dict[str, subprocess.Popen] = {}
    paused: str | None = None
    with LinkProxy({nid: f.mesh_port for nid, f in nodes.items()}, race.after, race.before) as proxy, \
            nodes_running(nodes.values(), procs):
        try:
            for nid in IDS:  # n2 is the one voter, so it leads throughout
                procs[nid] = start_node(nodes[nid], "--voters", LEADER, "--peers", proxy.peers_arg(nid),
                                        "--profile", "fast", env=env)
            assert wait_until(lambda: leader_of(list(nodes.values())), 120, what="a leader") == LEADER

            assert race.held.wait(700), "no claimant proposed a decision for generation 1"
            c1 = race.first
            c2 = next(n for n in IDS if n not in (c1, LEADER))
            assert stage(nodes[c1]) == (1, "evaluated")  # it trained and evaluated generation 1
            os.killpg(procs[c1].pid, signal.SIGSTOP)  # paused: no renewal reaches the leader
            paused = c1

            # The claim lapses (TTL 10 s, see CONFIG); the leader gives the generation to C2.
            # Then C1's held decision reaches the leader: refused, 409, its claim is stale.
            wait_until(lambda: race.answers.get(c1), 300, what=f"the leader's answer to {c1}'s decision")
            assert race.claimed_by == c2
            os.killpg(procs[c1].pid, signal.SIGCONT)
            paused = None
            status, answer = race.answers[c1][0]
            assert status == 409 and answer["error"].startswith("stale claim"), (status, answer)
            # C2 trains the generation and proposes: committed. C1 never is.
            wait_until(lambda: any(s == 200 for s, _ in race.answers.get(c2, [])), 600, interval=0.5,
                       what=f"{c2} committing generation 1")
            assert all(s == 409 for s, _ in race.answers[c1]), race.answers[c1]

            # Every node ends with C2's record, C1 included (it learns it by gossip).
            wait_until(lambda: all(decided(f) for f in nodes.values()), 120, interval=0.5,
                       what="generation 1 on every node")
            wait_until(lambda: stage(nodes[c1]) != (1, "evaluated"), 60, what=f"{c1} dropping generation 1")
        finally:  # before the nodes stop: a paused node cannot drain, a held request must not outlive the test
            if paused is not None:
                os.killpg(procs[paused].pid, signal.SIGCONT)
            if race.release is not None:
                proxy.call(race.release.set)

    records = {nid: decided(f) for nid, f in nodes.items()}
    assert len({json.dumps(r, sort_keys=True) for r in records.values()}) == 1, records
    record = records[LEADER]
    assert record["trained_by"] == c2 and record["promoted"], record
    # Decided exactly once: one commit on the leader, for C2's model.
    commits = [json.loads(line) for line in (nodes[LEADER].root / "node.log").read_text(errors="replace").splitlines()
               if '"generation_committed"' in line]
    assert [(c["generation"], c["sha256"]) for c in commits if c["generation"] == 1] == [(1, record["sha256"][:12])]
    # C1 trained a candidate of its own, which lost: recorded as not committed, never promoted.
    assert (nodes[c1].data_dir / "runs" / "gen_0001" / "candidate.safetensors").exists()
    with ModelRegistry(nodes[c1].data_dir / "registry.db") as registry:
        mine = [m for m in registry.models() if m.generation == 1 and m.sha256 != record["sha256"]]
    assert len(mine) == 1 and mine[0].status is ModelStatus.REJECTED and "not committed" in mine[0].reason, mine
