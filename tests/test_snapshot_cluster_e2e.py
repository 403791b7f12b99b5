"""Disaster recovery on a live 3-node cluster (docs/OPERATIONS.md): a voter's snapshot is taken,
the cluster decides something after it (a rollback, through the voter quorum), the voter's disk
is lost, and it is restored from the older snapshot. It rejoins under the same id without
stepping on the newer term or decision: one leader, the rollback kept on every node (the
restored one learns it), the seeded generations unchanged.

Then every machine is lost: the same snapshot is restored onto three fresh data dirs, each
node under its own id and config, and the new cluster continues from the snapshot's
generation: one leader, every node at the snapshot's pipeline generation and best model with
its decided generations (the rollback taken after the snapshot is gone, as the guide says).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import urllib.request

import pytest

from app.cli.snapshot import summarize
from tests.ops_cluster import IDS, make_nodes, seed_generations, start
from tests.orchestrator_helpers import ROOT, nodes_running, wait_until

pytestmark = pytest.mark.slow


def statuses(nodes) -> list[dict]:
    out = []
    for files in nodes:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{files.mesh_port}/status", timeout=3) as resp:
                out.append(json.loads(resp.read()))
        except OSError:
            pass
    return out


def one_leader(nodes) -> str | None:
    """The one leader every answering node names, when all three answer and agree."""
    seen = statuses(nodes)
    leaders = [s["node_id"] for s in seen if s.get("role") == "leader"]
    named = {s.get("leader") for s in seen}
    return leaders[0] if len(seen) == 3 and len(leaders) == 1 and named == {leaders[0]} else None


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=90, env=os.environ.copy())


@pytest.mark.timeout(600)
def test_a_voter_restored_from_a_snapshot_rejoins_without_losing_a_decision(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MESH_SECRET", secrets.token_hex(16))
    nodes = make_nodes(tmp_path)
    sha_a, sha_b = seed_generations(nodes, tmp_path, 2).shas
    procs = {nid: start(files, i, nodes) for i, (nid, files) in enumerate(zip(IDS, nodes))}
    victim = nodes[2]
    archive = tmp_path / "n2.snap"
    with nodes_running(nodes, procs, stop_timeout=35, tail_chars=2500):
        wait_until(lambda: all(f.state().get("best_sha256") == sha_b for f in nodes), 90, what="every node on gen 2")
        wait_until(lambda: one_leader(nodes), 60, what="one leader")
        saved = cli("snapshot", "save", str(archive), "--config", str(victim.config))
        assert saved.returncode == 0, saved.stderr

        # decided after the snapshot: the restored voter's copy will not have it
        rolled = cli("--json", "--node", f"127.0.0.1:{nodes[0].mesh_port}", "rollback", "--reason", "after the snapshot")
        assert rolled.returncode == 0, rolled.stdout + rolled.stderr
        record = json.loads(rolled.stdout)["record"]
        wait_until(lambda: all(f.state().get("best_sha256") == sha_a for f in nodes), 90, what="every node on gen 1")
        term_before = max(s["term"] for s in statuses(nodes))

        os.killpg(procs["n2"].pid, signal.SIGKILL)  # the disk is lost with the machine
        procs["n2"].wait(timeout=10)
        shutil.rmtree(victim.data_dir)
        restored = cli("snapshot", "restore", str(archive), "--data-dir", str(victim.data_dir))
        assert restored.returncode == 0, restored.stderr
        assert victim.state().get("best_sha256") == sha_b  # the snapshot predates the rollback
        procs["n2"] = start(victim, 2, nodes)

        leader = wait_until(lambda: one_leader(nodes), 90, what="one leader after the restore")
        wait_until(lambda: victim.state().get("best_sha256") == sha_a, 90, what="the restored voter follows the rollback")
        wait_until(lambda: (victim.data_dir / "rollbacks.json").exists(), 30, what="rollbacks.json on the restored voter")
        held = [json.loads((f.data_dir / "rollbacks.json").read_text()) for f in nodes]
        assert all(h == [record] for h in held), held
        generations = [json.loads((f.data_dir / "generations.json").read_text()) for f in nodes]
        assert all([(r["generation"], r["sha256"]) for r in g][:2] == [(1, sha_a), (2, sha_b)] for g in generations)
        now = statuses(nodes)
        assert all(s["term"] >= term_before for s in now) and one_leader(nodes) == leader, now

        # --- the whole cluster lost: the one snapshot restored onto three fresh dirs ---
        for proc in procs.values():  # every machine lost at once
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        for files in nodes:
            shutil.rmtree(files.data_dir)
        restores = [subprocess.Popen([sys.executable, "-m", "app.cli", "snapshot", "restore", str(archive),
                                      "--data-dir", str(f.data_dir)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
                    for f in nodes]  # one per machine, at once
        assert all(r.wait(timeout=90) == 0 for r in restores), [r.stderr.read() for r in restores if r.stderr]
        snapshot = summarize(nodes[0].data_dir)["pipeline"]  # the restored dir is the manifest's
        # in place: nodes_running stops what `procs` holds when the block ends
        procs.update({nid: start(files, i, nodes) for i, (nid, files) in enumerate(zip(IDS, nodes))})
        wait_until(lambda: one_leader(nodes), 90, what="one leader of the restored cluster")
        assert snapshot["best_sha256"] == sha_b  # taken before the rollback
        for files in nodes:  # each continues from the snapshot's generation, not from its own past
            state = files.state()
            assert (state["generation"], state["best_sha256"]) == (snapshot["generation"], sha_b), state
            decided = json.loads((files.data_dir / "generations.json").read_text())
            assert [(r["generation"], r["sha256"]) for r in decided] == [(1, sha_a), (2, sha_b)]
            assert not (files.data_dir / "rollbacks.json").exists()  # decided after the snapshot: lost with it
        assert one_leader(nodes) is not None  # the restored voters hold a quorum on the snapshot's term
