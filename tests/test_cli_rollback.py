"""`python -m app.cli rollback` on a live 3-node cluster: a decision committed through the voter
quorum. Every node ends on the previous best, the decision survives a leader kill right after
it, and no node can be talked into a second answer.

The nodes start with two promoted generations already decided (tests/ops_cluster.py), so the
test needs no training run; the rollback itself goes through the real mesh, quorum and
distribution daemon.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import urllib.request

import pytest

from tests.ops_cluster import IDS, make_nodes, seed_generations, start
from tests.orchestrator_helpers import ROOT, nodes_running, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


def _leader(nodes) -> str | None:
    for files in nodes:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{files.mesh_port}/status", timeout=3) as resp:
                status = json.loads(resp.read())
        except OSError:
            continue
        if status.get("role") == "leader":
            return status["node_id"]
    return None


def cli(*args: str) -> tuple[int, dict | str]:
    proc = subprocess.run([sys.executable, "-m", "app.cli", "--json", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=90, env=os.environ.copy())
    out = proc.stdout.strip()
    try:
        return proc.returncode, json.loads(out)
    except ValueError:
        return proc.returncode, out + proc.stderr


def test_rollback_is_a_quorum_decision_that_survives_a_leader_kill(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = make_nodes(tmp_path)
    sha_a, sha_b = seed_generations(nodes, tmp_path, 2).shas
    procs = {nid: start(files, i, nodes) for i, (nid, files) in enumerate(zip(IDS, nodes))}
    addr = {nid: f"127.0.0.1:{f.mesh_port}" for nid, f in zip(IDS, nodes)}
    with nodes_running(nodes, procs, stop_timeout=35, tail_chars=2500):
        wait_until(lambda: all(f.state().get("best_sha256") == sha_b for f in nodes), 90,
                   what="every node on generation 2")
        code, status = cli("status", "--node", addr["n0"])
        assert code == 0 and sorted(s["node_id"] for s in status["nodes"]) == IDS
        leader = wait_until(lambda: _leader(nodes), 60, what="a leader")
        follower = next(n for n in IDS if n != leader)

        # Sent to a follower: forwarded to the leader, decided through the quorum.
        code, answer = cli("rollback", "--node", addr[follower], "--reason", "gen 2 plays badly")
        assert code == 0, answer
        assert answer["rolled_back"] == 2 and answer["best_generation"] == 1 and answer["best_sha256"] == sha_a
        first = answer["record"]

        # Kill the leader right after it answered.
        os.killpg(procs[leader].pid, signal.SIGKILL)
        procs[leader].wait(timeout=10)
        survivors = [f for nid, f in zip(IDS, nodes) if nid != leader]
        wait_until(lambda: all(f.state().get("best_sha256") == sha_a for f in survivors), 90,
                   what="the survivors on generation 1")

        # A second rollback of generation 2, with another reason, through another node: the same
        # answer (one decided value per key), never a second one.
        other = next(n for n in IDS if n not in (leader, follower))
        code, again = wait_until(lambda: (lambda r: r if r[0] == 0 else None)(
            cli("rollback", "--node", addr[other], "--generation", "2", "--reason", "different")), 60,
            interval=1.0, what="a second rollback answered by the new leader")
        assert again["record"] == first and again["already"] is True
        # Nothing earlier than generation 1 to return to: refused, nothing decided.
        code, refused = cli("rollback", "--node", addr[other])
        assert code == 1 and "before 1" in json.dumps(refused)

        # The killed node comes back and follows the decision too.
        procs[leader] = start(nodes[IDS.index(leader)], IDS.index(leader), nodes)
        wait_until(lambda: all(f.state().get("best_sha256") == sha_a for f in nodes), 90,
                   what="every node, the restarted one too, on generation 1")
        wait_until(lambda: all((f.data_dir / "rollbacks.json").exists() for f in nodes), 30, what="rollbacks.json")
        held = [json.loads((f.data_dir / "rollbacks.json").read_text()) for f in nodes]
        assert all(h == [first] for h in held), held
        code, progress = cli("progress", "--node", addr[follower])
        assert code == 0 and progress["rolled_back"] == [2] and progress["current_best"] == sha_a

        # Drain the current leader: it hands leadership to another voter, then stops cleanly.
        leader = wait_until(lambda: _leader(nodes), 60, what="a leader")
        code, drained = cli("drain", "--node", addr[leader])
        assert code == 0 and drained["drain"]["draining"] is True, drained
        assert drained["transfer"]["transferred_to"] != leader
        assert procs[leader].wait(timeout=60) == 0
        wait_until(lambda: _leader([f for nid, f in zip(IDS, nodes) if nid != leader]), 60,
                   what="another node leading")
