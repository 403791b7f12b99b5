"""Per-node identity and signed answers (issue 45, items 2-4), on real nodes on 127.0.0.1.

With per-node keys from the cluster tool (`python -m app.coordination.p2p.tls init`, used as
`mesh.node_keys`, plain HTTP) a key speaks for the node its certificate names and no other:
not for the leader, not in a claim, not in gossip of another node's state. Without the secret
(or the key), whatever answers at a voter's address is not believed: its unsigned or
mis-signed answers are refused, counted, and change no term."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from app.config import Settings
from app.config.mesh import MeshConfig, TimingProfile, TlsConfig
from app.coordination.p2p.auth import sign
from app.coordination.p2p.identity import NodeKey
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.schemas import state_text
from tests.mesh_helpers import ROOT, free_ports, wait_for
from tests.orchestrator_helpers import BUSY_CPU_TIMING
from tests.test_mesh_node import leader_of

pytestmark = pytest.mark.timeout(120)
IDS = ["n0", "n1", "n2"]
SECRET = b"identity-test-secret"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    done = subprocess.run([sys.executable, "-m", "app.coordination.p2p.tls", "init", "--dir", str(out),
                           "--nodes", ",".join([*IDS, "mallory"])], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return out


def keys(certs: Path, node_id: str) -> TlsConfig:
    return TlsConfig(ca_file=certs / "ca.pem", cert_file=certs / f"{node_id}.pem", key_file=certs / f"{node_id}.key")


def trio_of(root: Path, settings_of, secret: bytes | None = None) -> list[MeshNode]:  # type: ignore[no-untyped-def]
    ports = free_ports(3)
    return [MeshNode(settings_of(IDS[i]), node_id=IDS[i], host="127.0.0.1", port=ports[i], data_dir=root / IDS[i],
                     peers=[f"{IDS[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i], voters=IDS, priority=i,
                     timing=TimingProfile(**BUSY_CPU_TIMING), secret=secret) for i in range(3)]


async def post(node: MeshNode, path: str, raw: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{node.addr}{path}", data=raw, headers=headers,
                          timeout=aiohttp.ClientTimeout(total=10)) as r:
            return r.status, json.loads(await r.text())


def signed_by(key: NodeKey | bytes, node: MeshNode, path: str, body: object, sender: str) -> tuple[bytes, dict]:
    raw = json.dumps(body).encode()
    return raw, sign(key, "POST", path, raw, sender=sender, receiver=node.node_id, boot=node.boot)


async def test_a_node_key_speaks_for_its_own_node_only(tmp_path: Path, certs: Path) -> None:
    nodes = trio_of(tmp_path, lambda nid: Settings().model_copy(update={"mesh": MeshConfig(node_keys=keys(certs, nid))}))
    for n in nodes:
        await n.start()
    try:
        leader = await leader_of(nodes, 30.0)
        follower, member = [n for n in nodes if n is not leader]
        assert follower.status()["auth"] == "node_keys"
        mallory = NodeKey(keys(certs, "mallory"))  # a certificate from the cluster CA, but no member

        # mallory's key, claiming to be the leader: refused before the body is read
        raw, headers = signed_by(mallory, follower, "/heartbeat", {"term": leader.term + 1, "leader_id": leader.node_id},
                                 leader.node_id)
        status, data = await post(follower, "/heartbeat", raw, headers)
        assert status == 401 and data["code"] == "identity" and "key of mallory" in data["error"], data
        # a member's key, signing as another member (a claim of work under its id)
        own = NodeKey(keys(certs, member.node_id))
        body = {"node_id": follower.node_id, "capabilities": {}}
        raw, headers = signed_by(own, leader, "/work/claim", body, follower.node_id)
        status, data = await post(leader, "/work/claim", raw, headers)
        assert status == 401 and f"key of {member.node_id}" in data["error"], data
        raw, headers = signed_by(own, leader, "/work/claim", body, member.node_id)  # under its own id, for another
        status, data = await post(leader, "/work/claim", raw, headers)
        assert status == 400 and "signed by" in data["error"], data
        # the shared secret means nothing to a node-key cluster
        raw, headers = signed_by(SECRET, follower, "/gossip", {"sender": "n0", "states": []}, "n0")
        status, data = await post(follower, "/gossip", raw, headers)
        assert status == 401 and data["code"] == "mode", data

        # a member gossips another node's state, signed with its own key: refused, counted, not kept
        victim = follower.node_id
        forged = {"node_id": victim, "addr": "127.0.0.1:1", "incarnation": 2**53 - 1, "version": 1,
                  "role": "leader", "term": 2**53, "leader": victim}
        text = json.dumps(forged)
        sig, cert = own.sign(state_text(text))
        raw, headers = signed_by(own, leader, "/gossip", {"sender": member.node_id, "states": [
            {"state": text, "sig": sig, "cert": cert}]}, member.node_id)
        status, _ = await post(leader, "/gossip", raw, headers)
        assert status == 200
        held = leader.membership.state_of(victim)
        assert held is not None and held.incarnation < 1000 and held.role != "leader"
        refused = leader.status()["peers"]
        assert any(p["node_id"] == member.node_id and p["we_refused"] and p["we_refused"]["code"] == "state_identity"
                   for p in refused), refused

        async def still_follows() -> bool:  # and every node still sees the victim as it says it is
            return all((st := n.membership.state_of(victim)) is not None and st.role == "follower"
                       and st.incarnation < 1000 for n in nodes if n is not follower)
        await wait_for(still_follows, 10.0)
        assert leader.is_leader
    finally:
        for n in nodes:
            await n.stop()


class FakeVoter:
    """Answers at a voter's address without the cluster's secret: unsigned, or signed with
    another secret, every answer claiming term 2**53 (the wedge of the issue)."""

    def __init__(self, port: int, wrong_secret: bytes | None) -> None:
        self.port, self.wrong_secret = port, wrong_secret
        self.asked = 0
        self.runner: web.AppRunner | None = None

    async def answer(self, request: web.Request) -> web.Response:
        self.asked += 1
        body: dict = {"/vote": {"term": 2**53, "granted": False, "voter_id": "n2"},  # each a valid answer
                      "/heartbeat": {"term": 2**53, "ok": False, "node_id": "n2"},
                      "/gossip": {"sender": "n2", "states": []}}.get(request.path, {"term": 2**53, "ok": False})
        if request.path == "/mesh/hello":
            body = {"node_id": "n2", "boot": 1}
        resp = web.json_response(body)
        resp.headers["X-Mesh-Node"] = "n2"
        resp.headers["X-Mesh-Boot"] = "1"
        if self.wrong_secret is not None:  # signed, but not with the cluster's secret
            from app.coordination.p2p.answers import answer_headers
            from app.coordination.p2p.identity import SharedKey

            asker = request.headers.get("X-Mesh-From", "")
            nonce = request.headers.get("X-Mesh-Nonce", "")
            resp.headers.update(answer_headers(SharedKey(self.wrong_secret), "n2", 1, asker, nonce, 200, resp.body, 0.0,
                                              method=request.method, path=request.path))
        return resp

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.answer)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


@pytest.mark.parametrize("wrong_secret", [None, b"not-the-cluster-secret"], ids=["unsigned", "mis-signed"])
async def test_answers_not_signed_by_the_voter_asked_are_refused_and_wedge_nothing(
        tmp_path: Path, wrong_secret: bytes | None) -> None:
    nodes = trio_of(tmp_path, lambda nid: Settings(), secret=SECRET)
    fake = FakeVoter(nodes[2].port, wrong_secret)
    await fake.start()
    real = nodes[:2]
    for n in real:
        await n.start()
    try:
        leader = await leader_of(real, 30.0)  # two of three voters: a quorum without the fake
        assert fake.asked > 0

        async def refused_counted() -> bool:
            return all(any(p["node_id"] == "n2" and p["we_refused"] and p["we_refused"]["code"].startswith("answer_")
                           for p in n.status()["peers"]) for n in real)
        await wait_for(refused_counted, 15.0)
        assert all(n.term < 100 for n in real) and leader.is_leader
        assert all((st := n.membership.state_of("n2")) is None or st.term < 100 for n in real)
        for n in real:
            assert n.registry.get_sample_value(
                "mesh_refusals_total", {"direction": "in", "reason": "answer_unsigned" if wrong_secret is None
                                        else "answer_signature"}), n.node_id
        # the leader can still hand over and elect: nothing was wedged
        other = next(n for n in real if n is not leader)
        assert await leader.consensus.transfer_leadership(other.node_id, {n.node_id for n in real}) is None
        assert (await leader_of(real, 30.0)).node_id == other.node_id
    finally:
        for n in real:
            await n.stop()
        await fake.stop()


async def test_a_forged_incarnation_is_refused_or_refuted_by_its_owner_under_the_shared_secret(tmp_path: Path) -> None:
    """The issue's case: a holder of the secret gossips a follower as leader@2**53 at
    incarnation 2**53. Relayed, it is refused at once; sent as if by the victim itself (which
    the shared secret cannot tell apart), the victim's own next gossip refutes it."""
    from tests.mesh_helpers import signed_state

    nodes = trio_of(tmp_path, lambda nid: Settings(), secret=SECRET)
    for n in nodes:
        await n.start()
    try:
        leader = await leader_of(nodes, 30.0)
        target, victim = [n for n in nodes if n is not leader]
        forged = {"node_id": victim.node_id, "addr": victim.addr, "incarnation": 2**53, "version": 1,
                  "role": "leader", "term": 2**53, "leader": victim.node_id}
        raw, headers = signed_by(SECRET, target, "/gossip", {"sender": "mallory", "states": [
            signed_state(SECRET, forged)]}, "mallory")
        assert (await post(target, "/gossip", raw, headers))[0] == 200
        assert target.membership.state_of(victim.node_id).incarnation < 1000  # type: ignore[union-attr]
        raw, headers = signed_by(SECRET, target, "/gossip", {"sender": victim.node_id, "states": [
            signed_state(SECRET, forged)]}, victim.node_id)
        assert (await post(target, "/gossip", raw, headers))[0] == 200

        async def refuted() -> bool:
            return all((st := n.membership.state_of(victim.node_id)) is not None and st.role == "follower"
                       and st.incarnation < 1000 for n in nodes if n is not victim)
        await wait_for(refuted, 10.0)
        assert victim.membership.local.incarnation < 1000 and leader.is_leader
        assert all(n.term < 1000 for n in nodes)
    finally:
        for n in nodes:
            await n.stop()
