"""Signing, replay protection and body validation against a real node's HTTP server."""

from __future__ import annotations

import json
import time
from pathlib import Path

import aiohttp
import pytest

from app.config.base import ConfigError
from app.coordination.p2p.auth import (
    BOOT_HEADER,
    DIGEST_HEADER,
    FROM_HEADER,
    NONCE_HEADER,
    SIG_HEADER,
    TO_HEADER,
    TS_HEADER,
    AuthError,
    NonceCache,
    Verifier,
    load_secret,
    sign,
)
from app.coordination.p2p.node import MeshNode
from tests.mesh_helpers import signed

pytestmark = pytest.mark.timeout(60)
SECRET = b"api-test-secret"


@pytest.fixture
async def node(tmp_path: Path):  # type: ignore[no-untyped-def]
    n = MeshNode(node_id="solo", host="127.0.0.1", port=0, data_dir=tmp_path, profile="fast", secret=SECRET)
    n.max_body_bytes = 4096
    await n.start()
    try:
        yield n
    finally:
        await n.stop()


async def post(addr: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as s:
        async with s.post(f"http://{addr}{path}", data=body, headers=headers) as r:
            return r.status, json.loads(await r.text())


GOSSIP = json.dumps({"sender": "x", "states": [], "view": {}}).encode()


async def test_signed_request_accepted_and_operator_endpoints_public(node: MeshNode) -> None:
    status, data = await post(node.addr, "/gossip", GOSSIP, await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x"))
    assert status == 200 and data["sender"] == "solo"
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.addr}/status") as r:
            st = await r.json()
            assert r.status == 200 and st["node_id"] == "solo" and st["quorum_level"] == "healthy"
        async with s.get(f"http://{node.addr}/progress") as r:
            assert r.status == 200 and await r.json() == {"generations": []}
    node.set_progress_provider(lambda: {"generations": [{"generation": 1, "elo": 12.5}]})
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.addr}/progress") as r:
            assert (await r.json())["generations"][0]["elo"] == 12.5


async def test_unsigned_tampered_stale_replayed_are_401(node: MeshNode) -> None:
    assert (await post(node.addr, "/gossip", GOSSIP, {}))[0] == 401
    headers = await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x")
    tampered = GOSSIP.replace(b'"x"', b'"y"')
    status, data = await post(node.addr, "/gossip", tampered, headers)
    assert status == 401 and "does not match its signed digest" in data["error"]
    assert (await post(node.addr, "/vote", GOSSIP, headers))[0] == 401  # signed for another path
    assert (await post(node.addr, "/gossip", GOSSIP, await signed(b"wrong", node.addr, "POST", "/gossip", GOSSIP, sender="x")))[0] == 401
    stale = await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x", now=time.time() - 301)
    status, data = await post(node.addr, "/gossip", GOSSIP, stale)
    assert status == 401 and "window" in data["error"]
    fresh = await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x")
    assert (await post(node.addr, "/gossip", GOSSIP, fresh))[0] == 200
    status, data = await post(node.addr, "/gossip", GOSSIP, fresh)
    assert status == 401 and "replayed" in data["error"]


async def test_bad_bodies_are_400_or_413_with_a_message(node: MeshNode) -> None:
    for body, expect in [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (json.dumps({"term": -1, "candidate_id": "a"}).encode(), "term"),
        (json.dumps({"term": 1, "candidate_id": "a", "surprise": 1}).encode(), "surprise"),
        (json.dumps({"term": 1, "candidate_id": "bad id!"}).encode(), "candidate_id"),
    ]:
        status, data = await post(node.addr, "/vote", body, await signed(SECRET, node.addr, "POST", "/vote", body))
        assert status == 400 and expect in data["error"], (body, data)
    big = b"{" + b" " * 5000 + b"}"
    status, data = await post(node.addr, "/gossip", big, await signed(SECRET, node.addr, "POST", "/gossip", big))
    assert status == 413 and "larger" in data["error"]


async def test_a_large_signed_body_arrives_whole_and_a_streamed_oversized_one_is_413(tmp_path: Path) -> None:
    """A body of many TCP chunks is read to its end before it is checked against its signed
    digest (a single read returns only what has arrived), and a chunked body without a length
    still has a limit."""
    n = MeshNode(node_id="big", host="127.0.0.1", port=0, data_dir=tmp_path, profile="fast", secret=SECRET)
    n.max_body_bytes = 1 << 20
    await n.start()
    try:
        pad = "x" * 600_000
        big = json.dumps({"sender": "x", "states": [], "view": {}, "pad": pad}).encode()
        status, data = await post(n.addr, "/gossip", big, await signed(SECRET, n.addr, "POST", "/gossip", big, sender="x"))
        assert status == 200 or (status == 400 and "pad" in data["error"]), data  # never a bad signature
        huge = b"{" + b" " * (1 << 20) + b"}"

        async def chunks():  # no Content-Length: the server must count as it reads
            for i in range(0, len(huge), 65536):
                yield huge[i:i + 65536]

        async with aiohttp.ClientSession() as s:
            async with s.post(f"http://{n.addr}/gossip", data=chunks(),
                              headers=await signed(SECRET, n.addr, "POST", "/gossip", huge)) as r:
                assert r.status == 413 and "larger" in (await r.json())["error"]
    finally:
        await n.stop()


async def test_work_endpoints_validate_and_fence(node: MeshNode) -> None:
    async def until_leader() -> None:
        import asyncio
        for _ in range(100):
            if node.is_leader:
                return
            await asyncio.sleep(0.05)
        raise AssertionError("a lone voter must elect itself")

    await until_leader()
    body = json.dumps({"node_id": "w", "item_id": "demo:1", "token": {"term": 0, "seq": 1}}).encode()
    status, data = await post(node.addr, "/work/complete", body, await signed(SECRET, node.addr, "POST", "/work/complete", body, sender="w"))
    assert status == 409 and "stale term" in data["reason"]
    body = json.dumps({"node_id": "w"}).encode()
    status, data = await post(node.addr, "/work/claim", body, await signed(SECRET, node.addr, "POST", "/work/claim", body, sender="w"))
    assert status == 200 and data["status"] == "no_work"


def test_verifier_and_nonce_cache_units() -> None:
    v = Verifier(SECRET, "me", 3)
    h = sign(SECRET, "POST", "/a?x=1", b"body", sender="a", receiver="me", boot=3, now=1000.0)
    assert v.verify("POST", "/a?x=1", h, b"body", now=1000.0) == "a"
    with pytest.raises(AuthError, match="replayed"):
        v.verify("POST", "/a?x=1", h, b"body", now=1001.0)
    with pytest.raises(AuthError, match="unsigned"):
        v.verify("POST", "/a", {TS_HEADER: "1"}, b"", now=1.0)
    with pytest.raises(AuthError, match="malformed"):
        v.verify("POST", "/a", {TS_HEADER: "x", NONCE_HEADER: "n", SIG_HEADER: "s", FROM_HEADER: "a",
                                TO_HEADER: "me", BOOT_HEADER: "3", DIGEST_HEADER: "0" * 64}, b"", now=1.0)
    with pytest.raises(AuthError, match="receiver|addressed to other"):
        v.verify("POST", "/a", sign(SECRET, "POST", "/a", b"", sender="a", receiver="other", boot=3, now=5.0), b"", now=5.0)
    with pytest.raises(AuthError, match="boot 2"):
        v.verify("POST", "/a", sign(SECRET, "POST", "/a", b"", sender="a", receiver="me", boot=2, now=5.0), b"", now=5.0)
    with pytest.raises(AuthError, match="not a finite number"):
        v.verify("POST", "/a", {**sign(SECRET, "POST", "/a", b"", sender="a", receiver="me", boot=3), TS_HEADER: "nan"},
                 b"", now=5.0)
    with pytest.raises(AuthError, match="clock 400 s ahead of ours"):
        v.verify("POST", "/a", sign(SECRET, "POST", "/a", b"", sender="a", receiver="me", boot=3, now=1405.0), b"",
                 now=1005.0)
    cache = NonceCache(window=300, capacity=2)
    cache.check_and_add("a", 10.0, 10.0)
    cache.check_and_add("b", 11.0, 11.0)
    cache.check_and_add("c", 12.0, 12.0)  # evicts "a" and raises the floor past it
    with pytest.raises(AuthError, match="too old"):
        cache.check_and_add("a", 10.0, 12.0)


def test_load_secret_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MESH_SECRET", raising=False)
    monkeypatch.delenv("MESH_SECRET_FILE", raising=False)
    with pytest.raises(ConfigError, match="no mesh secret"):
        load_secret()
    f = tmp_path / "s"
    f.write_text("from-file\n")
    monkeypatch.setenv("MESH_SECRET_FILE", str(f))
    assert load_secret() == b"from-file"
    monkeypatch.setenv("MESH_SECRET", "from-env")
    assert load_secret() == b"from-env"
    monkeypatch.delenv("MESH_SECRET")
    monkeypatch.delenv("MESH_SECRET_FILE")
    assert load_secret(config_secret="cfg") == b"cfg"
    generated = load_secret(data_dir=tmp_path / "d", allow_generate=True)
    assert len(generated) == 64 and load_secret(data_dir=tmp_path / "d", allow_generate=True) == generated
    (tmp_path / "empty").write_text("")
    with pytest.raises(ConfigError, match="empty"):
        load_secret(config_secret_file=tmp_path / "empty")


async def test_json_out_is_always_json_and_non_finite_numbers_are_refused_at_parse(node: MeshNode) -> None:
    """Issue 45, item 6: `1e309` reads as infinity in Python; it must not get in, and a
    non-finite value that got in another way must not turn /status into non-JSON."""
    from tests.mesh_helpers import signed_state

    def strict(text: str) -> dict:
        def refuse(name: str) -> None:
            raise AssertionError(f"{name} in an answer: not JSON")
        return json.loads(text, parse_constant=refuse)

    for number in ("1e309", "-1e400"):
        text = json.dumps({"node_id": "peer", "inventory": {"x": 1.0}}).replace("1.0", number)
        body = json.dumps({"sender": "peer", "states": [{**signed_state(SECRET, {}), "state": text}]}).encode()
        status, data = await post(node.addr, "/gossip", body, await signed(SECRET, node.addr, "POST", "/gossip", body,
                                                                           sender="peer"))
        assert status == 400 and "not a finite number" in data["error"], data
        raw = f'{{"term": {number}, "candidate_id": "a"}}'.encode()
        status, data = await post(node.addr, "/vote", raw, await signed(SECRET, node.addr, "POST", "/vote", raw))
        assert status == 400 and "not a finite number" in data["error"], data
    node.update_local_state(inventory={"x": float("inf"), "y": [float("nan")]})
    async with aiohttp.ClientSession() as s:
        async with s.get(f"http://{node.addr}/status") as r:
            assert r.status == 200
            assert strict(await r.text())["inventory"]["x"] is None


async def test_a_withheld_request_is_stale_after_seconds_not_minutes(node: MeshNode) -> None:
    """Issue 45, item 7: the signed timestamp must be within mesh.limits.clock_window_s (10 s)."""
    assert node.limits.clock_window_s == 10.0
    withheld = await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x", now=time.time() - 12)
    status, data = await post(node.addr, "/gossip", GOSSIP, withheld)
    assert status == 401 and data["code"] == "clock" and "window of 10 s" in data["error"], data
    recent = await signed(SECRET, node.addr, "POST", "/gossip", GOSSIP, sender="x", now=time.time() - 5)
    assert (await post(node.addr, "/gossip", GOSSIP, recent))[0] == 200
