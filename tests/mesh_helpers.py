"""Shared helpers of the mesh tests: free ports, real node processes, a fault-injecting TCP
proxy, the history invariant checker, and a tiny worker process (`python -m tests.mesh_helpers`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from app.coordination.p2p.persist import leaders_by_term, read_history
from app.free_ports import free_ports as pick_free_ports

ROOT = Path(__file__).resolve().parents[1]
SECRET = "test-mesh-secret"
# How long a test waits for a state the mesh must reach (a leader, a step-down) with both cores
# busy and several node processes: a bound on the test, not a speed aim. The profile's
# detection and failover aims are held by scripts/bench_mesh.py.
LIVENESS_S = 45.0


def free_ports(n: int) -> list[int]:
    """Ports outside the ephemeral range (app/free_ports.py says why), each xdist worker in
    its own stretch of it, so two workers' nodes never start on one port; without xdist the
    process id picks the stretch, so two pytest runs at once (two checkouts) start apart."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return pick_free_ports(n, slot=int(worker[2:]) if worker[2:].isdigit() else None)


async def wait_for(cond: Callable[[], Awaitable[Any]], timeout: float, interval: float = 0.05) -> Any:
    """Poll `cond` until it returns something truthy; its value, or AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await cond()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {timeout}s (last value: {last!r})")


async def hello(addr: str) -> tuple[str, int]:
    """(node id, boot) of the node at `addr`, from its public GET /mesh/hello."""
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{addr}/mesh/hello", timeout=aiohttp.ClientTimeout(total=5.0)) as r:
            data = await r.json()
            return data["node_id"], data["boot"]


async def signed(secret: bytes | str, addr: str, method: str, path: str, body: bytes, sender: str = "tester",
                 now: float | None = None) -> dict[str, str]:
    """Headers signing one request from `sender` to whichever node (and boot) answers at `addr`."""
    from app.coordination.p2p.auth import sign

    receiver, boot = await hello(addr)
    key = secret.encode() if isinstance(secret, str) else secret
    return sign(key, method, path, body, sender=sender, receiver=receiver, boot=boot, now=now)


async def refused_both_ways(addr: str, method: str, path: str, body: bytes = b"") -> None:
    """A holder of another secret believes none of the node's answers (its signed answers do not
    verify: AnswerRefused), and the node refuses what it signs (401)."""
    import pytest

    from app.coordination.p2p.client import AnswerRefused, MeshClient

    stranger = MeshClient(b"another-secret", timeout=5.0, node_id="stranger")
    try:
        with pytest.raises(AnswerRefused, match="bad signature"):
            await stranger.request(method, addr, path, body or None)
    finally:
        await stranger.close()
    headers = await signed(b"another-secret", addr, method, path, body, sender="stranger")
    async with aiohttp.ClientSession() as s:
        async with s.request(method, f"http://{addr}{path}", data=body, headers=headers) as r:
            assert r.status == 401, await r.text()


def signed_state(key: bytes | str, state: dict[str, Any]) -> dict[str, Any]:
    """A node state as gossip carries it: the JSON text and its owner's signature (here any holder
    of the shared secret `key`, which is exactly what the shared-secret mode trusts)."""
    from app.coordination.p2p.identity import as_identity
    from app.coordination.p2p.schemas import state_text

    text = json.dumps(state)
    sig, cert = as_identity(key).sign(state_text(text))
    return {"state": text, "sig": sig, **({"cert": cert} if cert else {})}


def assert_one_leader_per_term(data_dirs: list[Path]) -> dict[int, set[str]]:
    """The invariant: across every node's history, never two leaders in one term; and every
    leader a node observed in a term is that term's leader."""
    histories = [read_history(d / "mesh_history.jsonl") for d in data_dirs]
    leaders = leaders_by_term(histories)
    for term, who in leaders.items():
        assert len(who) == 1, f"two leaders in term {term}: {who}"
    for events in histories:
        for ev in events:
            if ev.get("event") == "leader_observed" and ev["term"] in leaders:
                assert {ev["leader"]} == leaders[ev["term"]], ev
    return leaders


@dataclass
class NodeProc:
    node_id: str
    port: int
    data_dir: Path
    args: list[str]
    proc: subprocess.Popen | None = None
    log_path: Path | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.data_dir / "node.log"
        env = {**os.environ, "MESH_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.coordination.p2p", *self.args],
                cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True,
            )

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class Cluster:
    """N node processes on loopback. `route(i, j)` says which address node i uses for node j
    (a proxy port in partition tests, node j's own port otherwise)."""

    root: Path
    n: int
    profile: str = "fast"
    priorities: list[int] | None = None
    extra_args: list[str] = field(default_factory=list)
    route: Callable[[int, int], str] | None = None
    nodes: list[NodeProc] = field(default_factory=list)
    session: aiohttp.ClientSession | None = None

    def __post_init__(self) -> None:
        ports = free_ports(self.n)
        ids = [f"n{i}" for i in range(self.n)]
        prios = self.priorities or [0] * self.n
        for i in range(self.n):
            self.nodes.append(NodeProc(ids[i], ports[i], self.root / ids[i], []))
        for i, node in enumerate(self.nodes):
            peers = ",".join(
                f"{ids[j]}@{self.route(i, j) if self.route else self.nodes[j].addr}"
                for j in range(self.n) if j != i
            )
            node.args = [
                "--node-id", ids[i], "--host", "127.0.0.1", "--port", str(node.port),
                "--data-dir", str(node.data_dir), "--voters", ",".join(ids), "--priority", str(prios[i]),
                "--profile", self.profile, "--log-level", "WARNING", *self.extra_args,
            ]
            if peers:
                node.args += ["--peers", peers]

    @property
    def ids(self) -> list[str]:
        return [n.node_id for n in self.nodes]

    def start(self) -> None:
        for node in self.nodes:
            node.start()

    def stop(self) -> None:
        for node in self.nodes:
            node.signal(signal.SIGCONT)
            node.kill()

    def by_id(self, node_id: str) -> NodeProc:
        return next(n for n in self.nodes if n.node_id == node_id)

    async def status(self, node: NodeProc) -> dict | None:
        assert self.session is not None
        try:
            async with self.session.get(f"http://{node.addr}/status", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
                return await r.json() if r.status == 200 else None
        except (TimeoutError, aiohttp.ClientError, OSError):
            return None

    async def statuses(self, nodes: list[NodeProc] | None = None) -> dict[str, dict]:
        nodes = [n for n in (nodes or self.nodes) if n.running]
        results = await asyncio.gather(*(self.status(n) for n in nodes))
        return {n.node_id: s for n, s in zip(nodes, results) if s is not None}

    async def leaders(self, nodes: list[NodeProc] | None = None) -> list[tuple[str, int]]:
        return [(nid, s["term"]) for nid, s in (await self.statuses(nodes)).items() if s["role"] == "leader"]

    async def wait_ready(self, timeout: float = 20.0) -> None:
        async def all_up() -> bool:
            return len(await self.statuses()) == sum(1 for n in self.nodes if n.running)
        await wait_for(all_up, timeout)

    async def wait_single_leader(self, timeout: float, nodes: list[NodeProc] | None = None) -> tuple[str, int]:
        """One leader that every listed node agrees on."""
        async def agreed() -> tuple[str, int] | None:
            sts = await self.statuses(nodes)
            lead = [(nid, s["term"]) for nid, s in sts.items() if s["role"] == "leader"]
            if len(lead) == 1 and all(s["leader"] == lead[0][0] for s in sts.values()):
                return lead[0]
            return None
        return await wait_for(agreed, timeout)

    def check_invariant(self) -> dict[int, set[str]]:
        return assert_one_leader_per_term([n.data_dir for n in self.nodes])


class PartitionProxy:
    """A TCP proxy per directed pair (i -> j) on loopback. Pairs whose ends are in different
    groups are cut: open connections are closed and new ones are closed on accept."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.ports = {(i, j): p for (i, j), p in zip(
            [(i, j) for i in range(n) for j in range(n) if i != j], free_ports(n * (n - 1)))}
        self.targets: dict[int, int] = {}
        self.group_of: dict[int, int] = {i: 0 for i in range(n)}
        self.conns: dict[tuple[int, int], set[asyncio.StreamWriter]] = {k: set() for k in self.ports}
        self.servers: list[asyncio.AbstractServer] = []

    def route(self, i: int, j: int) -> str:
        return f"127.0.0.1:{self.ports[(i, j)]}"

    def allowed(self, i: int, j: int) -> bool:
        return self.group_of[i] == self.group_of[j]

    async def start(self, target_ports: list[int]) -> None:
        self.targets = dict(enumerate(target_ports))
        for (i, j), port in self.ports.items():
            server = await asyncio.start_server(
                lambda r, w, i=i, j=j: self._handle(i, j, r, w), "127.0.0.1", port
            )
            self.servers.append(server)

    def partition(self, groups: list[list[int]]) -> None:
        for g, members in enumerate(groups):
            for i in members:
                self.group_of[i] = g
        for (i, j), writers in self.conns.items():
            if not self.allowed(i, j):
                for w in list(writers):
                    w.close()

    def heal(self) -> None:
        self.partition([list(range(self.n))])

    async def _handle(self, i: int, j: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.allowed(i, j):
            writer.close()
            return
        try:
            up_r, up_w = await asyncio.open_connection("127.0.0.1", self.targets[j])
        except OSError:
            writer.close()
            return
        self.conns[(i, j)].update({writer, up_w})

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    if not self.allowed(i, j):
                        break
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
        finally:
            self.conns[(i, j)].discard(writer)
            self.conns[(i, j)].discard(up_w)

    async def stop(self) -> None:
        for s in self.servers:
            s.close()
        for writers in self.conns.values():
            for w in list(writers):
                w.close()
        for s in self.servers:
            await s.wait_closed()


# -- a worker process for the claim-TTL fault test ------------------------------------------
async def _worker_main(addr: str, node_id: str, hold: float) -> int:
    from app.coordination.p2p.client import MeshClient
    from app.coordination.p2p.worker import WorkClient

    client = MeshClient(os.environ["MESH_SECRET"].encode(), timeout=2.0, node_id=node_id)
    wc = WorkClient(client, node_id, addrs=lambda: [addr])
    try:
        claim = None
        deadline = time.monotonic() + 10
        while claim is None and time.monotonic() < deadline:
            claim = await wc.claim(kinds=["demo"])
            if claim is None:
                await asyncio.sleep(0.1)
        if claim is None:
            print(json.dumps({"claimed": None}), flush=True)
            return 1
        print(json.dumps({"claimed": claim.item.item_id, "token": claim.token.model_dump()}), flush=True)
        await asyncio.sleep(hold)  # the test stops us (SIGSTOP) in here
        outcome = await wc.complete(claim, {"by": node_id})
        print(json.dumps({"complete_status": outcome.status, "reason": outcome.reason}), flush=True)
        return 0
    finally:
        await client.close()


if __name__ == "__main__":
    _addr, _node_id, _hold = sys.argv[1], sys.argv[2], float(sys.argv[3])
    sys.exit(asyncio.run(_worker_main(_addr, _node_id, _hold)))
