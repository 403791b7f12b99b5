"""Fault tests with real node processes on loopback (fast profile): kill -9, SIGSTOP past the
lease, a flapping higher-priority node, whole-cluster restart, a claim holder stopped past
its TTL. Every test kills its process groups in `finally` and checks the history invariant."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from app.config.mesh import PROFILES
from app.coordination.p2p.auth import sign
from app.coordination.p2p.client import MeshClient
from app.coordination.p2p.persist import TermStore
from app.coordination.p2p.worker import WorkClient
from tests.mesh_helpers import LIVENESS_S, ROOT, SECRET, Cluster, hello, wait_for

FAST = PROFILES["fast"]


@pytest.mark.timeout(240)
async def test_kill9_failover_flapping_node_and_whole_cluster_restart(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 5, priorities=[0, 1, 2, 3, 4])
    cluster.session = aiohttp.ClientSession()
    try:
        cluster.start()
        await cluster.wait_ready()
        leader_id, term = await cluster.wait_single_leader(LIVENESS_S)

        # kill -9 the leader: the others agree on a new leader with a higher term (how fast
        # is bench_mesh.py's measurement against the profile's failover aim, not this test's)
        killed = cluster.by_id(leader_id)
        killed.kill()
        rest = [n for n in cluster.nodes if n is not killed]
        new_id, new_term = await cluster.wait_single_leader(LIVENESS_S, rest)
        assert new_term > term and new_id != leader_id

        # the highest-priority node other than the leader (n4, usually the one just killed)
        # flaps: it must not take leadership from the healthy leader, nor move the term
        flapper = max((n for n in cluster.nodes if n.node_id != new_id), key=lambda n: n.node_id)
        flapper.kill()
        for _ in range(2):
            flapper.start()

            async def follows() -> bool:
                st = await cluster.status(flapper)
                return bool(st) and st["leader"] == new_id and st["role"] == "follower"
            await wait_for(follows, LIVENESS_S)
            await asyncio.sleep(FAST.election_timeout_min + FAST.election_timeout_spread)
            assert await cluster.leaders() == [(new_id, new_term)]
            flapper.kill()
        assert await cluster.leaders() == [(new_id, new_term)]

        # whole-cluster restart: terms never go back
        before = {n.node_id: TermStore(n.data_dir / "mesh_term.json").term for n in cluster.nodes}
        for n in cluster.nodes:
            n.kill()
        cluster.start()
        await cluster.wait_ready()
        _, restart_term = await cluster.wait_single_leader(LIVENESS_S)
        assert restart_term > max(before.values())
        for n in cluster.nodes:
            assert TermStore(n.data_dir / "mesh_term.json").term >= before[n.node_id]
    finally:
        cluster.stop()
        await cluster.session.close()
    leaders = cluster.check_invariant()
    assert len(leaders) >= 3  # at least: first, after failover, after restart


@pytest.mark.timeout(240)
async def test_stale_claims_after_sigstop_and_claim_ttl_reassignment(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, 3, extra_args=["--demo-work", "1", "--demo-ttl", "1.5"])
    cluster.session = aiohttp.ClientSession()
    client = MeshClient(SECRET.encode(), timeout=2.0)
    worker: subprocess.Popen | None = None
    try:
        cluster.start()
        await cluster.wait_ready()
        leader_id, term = await cluster.wait_single_leader(LIVENESS_S)
        follower = next(n for n in cluster.nodes if n.node_id != leader_id)

        # -- a claim holder stopped past its TTL: the work is reassigned, its completion is 409
        worker = subprocess.Popen(
            [sys.executable, "-m", "tests.mesh_helpers", follower.addr, "w1", "3.0"],
            cwd=ROOT, env={**os.environ, "MESH_SECRET": SECRET, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )
        assert worker.stdout is not None
        line = await asyncio.wait_for(asyncio.to_thread(worker.stdout.readline), 20.0)
        os.killpg(worker.pid, signal.SIGSTOP)
        first = json.loads(line)
        assert first["claimed"] == "demo:0000" and first["token"]["term"] == term
        wc = WorkClient(client, "w2", addrs=lambda: [follower.addr])

        async def reclaimed():  # type: ignore[no-untyped-def]
            return await wc.claim(kinds=["demo"])
        second = await wait_for(reclaimed, 10.0, interval=0.2)
        assert second.item.item_id == "demo:0000" and second.item.attempts == 2
        assert second.token.seq > first["token"]["seq"]
        os.killpg(worker.pid, signal.SIGCONT)
        out, _ = await asyncio.wait_for(asyncio.to_thread(worker.communicate), 20.0)
        late = json.loads(out.strip().splitlines()[-1])
        assert late["complete_status"] == 409, late

        # -- SIGSTOP the leader past its lease: others elect; on SIGCONT it steps down and
        #    refuses the stale completion it receives first; the new leader refuses it too
        old = cluster.by_id(leader_id)
        old_id, old_boot = await hello(old.addr)
        old.signal(signal.SIGSTOP)
        rest = [n for n in cluster.nodes if n is not old]
        new_id, new_term = await cluster.wait_single_leader(LIVENESS_S, rest)
        assert new_term > term
        body = json.dumps({"node_id": "w2", "item_id": second.item.item_id,
                           "token": second.token.model_dump()}).encode()
        # the whole request is in the stopped process's socket (the kernel accepts for it)
        # before it runs again: written on a raw connection, not left to a client's timing
        headers = sign(SECRET.encode(), "POST", "/work/complete", body, sender="w2", receiver=old_id, boot=old_boot)
        host, port = old.addr.rsplit(":", 1)
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 10.0)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        writer.write(f"POST /work/complete HTTP/1.1\r\nHost: {old.addr}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n{head}\r\n".encode() + body)
        await writer.drain()
        assert writer.transport.get_write_buffer_size() == 0  # handed to the kernel, none left here
        old.signal(signal.SIGCONT)
        reply = await asyncio.wait_for(reader.read(), 10.0)
        writer.close()
        assert reply.startswith(b"HTTP/1.1 409"), reply[:300]

        async def stepped_down() -> bool:
            st = await cluster.status(old)
            return bool(st) and st["role"] == "follower" and st["term"] >= new_term
        await wait_for(stepped_down, LIVENESS_S)
        assert (await wc.complete(second)).status == 409  # stale term at the new leader
        assert await cluster.leaders() == [(new_id, new_term)]
        # a leader change lost no work: the item is claimable again under the new term
        third = await wait_for(reclaimed, 10.0, interval=0.2)
        assert third.token.term == new_term and third.item.item_id == "demo:0000"
        assert (await wc.complete(third)).ok
    finally:
        if worker is not None and worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=10)
        cluster.stop()
        await cluster.session.close()
        await client.close()
    cluster.check_invariant()
