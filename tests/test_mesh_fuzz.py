"""Hypothesis fuzz of every signed POST endpoint of real nodes: whatever the body, the answer is
never a 500, and no term, vote or commit moves. The bodies are signed by a stranger (a node id
that is no voter), so the checks under test are the ones after the signature: parsing, bounds,
and who may speak for whom.

The nodes run on their own event loop in a thread so hypothesis can drive them synchronously:
a lone voter that leads, and a voter of a three-voter cluster whose peers never come (a
follower for good)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.coordination.p2p.auth import sign
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.work_rules import WorkSpec
from tests.mesh_helpers import free_ports, signed_state

pytestmark = pytest.mark.timeout(300)
SECRET = b"fuzz-test-secret"  # before the strategies: gossiped states are signed with it too
POSTS = ["/gossip", "/vote", "/heartbeat", "/commit", "/commit/read", "/commit/decided", "/transfer/timeout_now",
         "/admin/transfer", "/work/claim", "/work/claim_training", "/work/renew", "/work/complete", "/work/fail"]
STRANGERS = ["mallory", "w1", "x"]  # never voters; transfer targets are drawn from these too

ints = st.one_of(st.integers(-5, 5), st.integers(), st.sampled_from([2**53, 2**53 + 1, 2**63, 2**64, -(2**63)]))
floats = st.floats(allow_nan=False, allow_infinity=False)
names = st.one_of(st.sampled_from(STRANGERS), st.text(max_size=12))
scalars = st.one_of(st.none(), st.booleans(), ints, floats, names)
json_values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                          st.dictionaries(names, kids, max_size=4)), max_leaves=12)
token = st.fixed_dictionaries({"term": ints, "seq": ints})
node_state = st.fixed_dictionaries({"node_id": names}, optional={
    "term": ints, "incarnation": ints, "version": ints, "capabilities": st.dictionaries(names, scalars, max_size=3),
    "claims": st.lists(st.fixed_dictionaries({"item_id": names, "token": token}), max_size=2), "role": names})
shaped = st.one_of(
    st.fixed_dictionaries({"term": ints, "leader_id": names}, optional={"key": names, "value": names,
                                                                      "sent_at": floats}),
    st.fixed_dictionaries({"term": ints, "candidate_id": names}, optional={"priority": ints, "pre_vote": st.booleans(),
                                                                         "transfer_from": names}),
    st.fixed_dictionaries({"sender": names}, optional={"states": st.lists(st.one_of(
        node_state.map(lambda d: signed_state(SECRET, d)), node_state), max_size=3),
                                                       "view": st.dictionaries(names, names, max_size=3)}),
    st.fixed_dictionaries({"node_id": names}, optional={"capabilities": st.dictionaries(names, scalars, max_size=3),
                                                        "kinds": st.lists(names, max_size=3), "item_id": names,
                                                        "token": token, "error": names}),
    st.fixed_dictionaries({"target": st.sampled_from(STRANGERS)}),
)
raw_bodies = st.one_of(
    st.binary(max_size=64),
    st.sampled_from([b"", b"{", b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
                     b'{"term": NaN, "leader_id": "x"}', b'{"term": Infinity, "candidate_id": "x"}',
                     b'{"term": ' + b"9" * 5000 + b', "leader_id": "x"}', "{\"node_id\": \"\ud800\"}".encode("utf-8", "surrogatepass"),
                     b'{"node_id": "w1", "capabilities": {"memory_gb": "abc"}}']),
)


class Loop:
    """An event loop in a thread, for driving async nodes from synchronous hypothesis tests."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro, timeout: float = 30.0):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Loop, list[MeshNode], aiohttp.ClientSession]]:
    root: Path = tmp_path_factory.mktemp("fuzz")
    loop = Loop()
    solo_port, v0_port, *absent = free_ports(4)

    async def start() -> tuple[list[MeshNode], aiohttp.ClientSession]:
        solo = MeshNode(node_id="solo", host="127.0.0.1", port=solo_port, data_dir=root / "solo", profile="fast",
                        secret=SECRET, work_source=lambda view: [WorkSpec("demo", "a"), WorkSpec("training", "g1")])
        v0 = MeshNode(node_id="v0", host="127.0.0.1", port=v0_port, data_dir=root / "v0", profile="fast",
                      secret=SECRET, voters=["v0", "v1", "v2"],
                      peers=[f"v{i + 1}@127.0.0.1:{p}" for i, p in enumerate(absent)])
        for n in (solo, v0):
            await n.start()
        for _ in range(200):
            if solo.is_leader:
                break
            await asyncio.sleep(0.05)
        return [solo, v0], aiohttp.ClientSession()

    started, session = loop.run(start())
    assert started[0].is_leader
    try:
        yield loop, started, session
    finally:
        async def stop() -> None:
            await session.close()
            for n in started:
                await n.stop()
        loop.run(stop())
        loop.close()


def durable(node: MeshNode) -> tuple[int, str | None, dict[str, str], str]:
    commits = node.data_dir / "mesh_commits.json"
    return node.store.term, node.store.voted_for, node.commits.decided_values(), \
        commits.read_text() if commits.exists() else ""


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(which=st.integers(0, 1), path=st.sampled_from(POSTS), sender=st.sampled_from(STRANGERS),
       body=st.one_of(shaped, json_values, raw_bodies))
def test_signed_random_bodies_never_get_a_500_and_move_no_term(nodes, which, path, sender, body) -> None:  # type: ignore[no-untyped-def]
    loop, started, session = nodes
    node = started[which]
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    before = durable(node)
    headers = sign(SECRET, "POST", path, raw, sender=sender, receiver=node.node_id, boot=node.boot)

    async def post() -> tuple[int, str]:
        async with session.post(f"http://{node.addr}{path}", data=raw, headers=headers,
                                timeout=aiohttp.ClientTimeout(total=20)) as r:
            return r.status, await r.text()

    status, text = loop.run(post())
    assert status != 500, (path, raw[:200], text[:300])
    assert status < 500 or (status == 503 and json.loads(text)["error"]), text  # 503: not the leader
    if status == 400:
        assert json.loads(text)["error"], text  # a reason, not a bare status
    assert durable(node) == before, (path, raw[:200], text[:300])
    if which == 0:
        assert started[0].is_leader  # the lone voter leads on, in the same term
