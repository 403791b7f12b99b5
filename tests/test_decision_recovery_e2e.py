"""A leader dies between storing a generation's decision on a quorum and telling anyone: the new
leader finds the value on the surviving voter and finishes the decision with that same value
(docs/ARCHITECTURE.md: "A new leader first reads the next generation's key from a quorum: a
decision its predecessor stored but never gossiped is found there").

Three real nodes, every mesh link through a proxy (tests/fault_proxy.py). When a voter answers
"stored" to the leader's `/commit` of `generation/1`, the leader already holds it itself, so a
quorum (2 of 3) stored it; the proxy kills the leader (SIGKILL) before the answer reaches it. So
the leader never learns it had a quorum, never marks the value decided, never announces it and
never gossips it: only the stored copies are left. The killed node, started again, ends with the
same record too.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import threading
from pathlib import Path

import pytest
from aiohttp import web

from tests.fault_proxy import LinkProxy, Passing
from tests.orchestrator_helpers import (
    SMALL_DAEMONS,
    TINY_CONFIG,
    NodeFiles,
    nodes_running,
    start_node,
    tiny_selfplay,
    wait_until,
    write_node_files,
)

pytestmark = pytest.mark.slow

IDS = ["n0", "n1", "n2"]
KEY = "generation/1"
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(16),
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5, "sync_budget_s": 20}},
}}


class KillAtQuorumStore:
    """Proxy hook: the first `/commit` of KEY a voter stored kills its sender, the leader."""

    def __init__(self) -> None:
        self.pids: dict[str, int] = {}
        self.killed: str | None = None
        self.value: dict | None = None  # the record the dead leader had stored on a quorum
        self.stored_on: str | None = None
        self.done = threading.Event()

    def __call__(self, p: Passing) -> web.Response | None:
        if self.killed is not None and self.killed in (p.src, p.dst):
            return web.Response(status=502, text="proxy: that node is dead")
        if self.done.is_set() or p.path != "/commit" or p.status != 200:
            return None
        req, answer = json.loads(p.body), json.loads(p.answer)
        if req.get("key") != KEY or not answer.get("stored"):
            return None
        os.killpg(self.pids[p.src], signal.SIGKILL)  # before the answer reaches it
        self.killed, self.stored_on, self.value = p.src, p.dst, json.loads(req["value"])
        self.done.set()
        return web.Response(status=502, text="proxy: leader killed")


def decided(files: NodeFiles) -> dict | None:
    path = files.data_dir / "generations.json"
    records = json.loads(path.read_text()) if path.exists() else []
    return next((g for g in records if g["generation"] == 1), None)


def log_has(files: NodeFiles, event: str) -> bool:
    path: Path = files.root / "node.log"
    return path.exists() and event in path.read_text(errors="replace")


@pytest.mark.timeout(1200)  # generous bounds: a generation on three nodes of two busy cores
def test_a_new_leader_finishes_the_decision_its_predecessor_stored_but_never_announced(tmp_path) -> None:
    env = {"MESH_SECRET": secrets.token_hex(16)}
    nodes = {nid: write_node_files(tmp_path / nid, nid, TINY_CONFIG, DAEMONS) for nid in IDS}
    hook = KillAtQuorumStore()
    procs: dict = {}

    def start(i: int, nid: str):
        # wan timing: three voters on a busy CPU must not flap (this test is about one leader change)
        return start_node(nodes[nid], "--voters", ",".join(IDS), "--peers", proxy.peers_arg(nid),
                          "--priority", str(i), "--profile", "wan", env=env)

    with LinkProxy({nid: f.mesh_port for nid, f in nodes.items()}, hook) as proxy, \
            nodes_running(nodes.values(), procs):
        for i, nid in enumerate(IDS):
            procs[nid] = start(i, nid)
            hook.pids[nid] = procs[nid].pid
        assert hook.done.wait(800), "no leader stored generation 1 on a quorum"
        leader = hook.killed
        survivors = [nid for nid in IDS if nid != leader]
        procs[leader].wait(timeout=30)
        assert decided(nodes[leader]) is None  # it died knowing of no decision
        assert not log_has(nodes[leader], "generation_committed")

        # The survivors elect a new leader that reads generation/1 from a quorum, finds the
        # stored value and finishes it: the same record, on both survivors.
        wait_until(lambda: all(decided(nodes[n]) for n in survivors), 120, interval=0.5,
                   what="generation 1 decided on the survivors")
        records = [decided(nodes[n]) for n in survivors]
        assert records[0] == records[1] == hook.value, (records, hook.value)

        # The killed leader, back, learns the same record (it held the value only as stored).
        hook.killed = None
        procs[leader] = start(IDS.index(leader), leader)
        wait_until(lambda: decided(nodes[leader]) == hook.value, 120, interval=0.5,
                   what="the restarted leader holding the same record")

    # One value for generation 1 everywhere, never contradicted (a second value would be refused
    # and logged as generation_record_refused).
    for nid, files in nodes.items():
        assert decided(files) == hook.value, nid
        assert not log_has(files, "generation_record_refused"), nid
