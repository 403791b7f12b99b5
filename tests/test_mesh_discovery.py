"""Peer discovery: static peer strings and the `tailscale status --json` wrapper (run as a
real subprocess: a stand-in script plays the tailscale binary)."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from app.coordination.p2p.discovery import (
    PeerAddr,
    TailscaleSource,
    parse_peer,
    parse_peer_list,
    parse_tailscale_status,
)

pytestmark = pytest.mark.timeout(30)

STATUS = {
    "Self": {"HostName": "me"},
    "Peer": {
        "nodekey:1": {"HostName": "gpu-box", "DNSName": "gpu-box.tail.ts.net.", "TailscaleIPs": ["100.64.0.2", "fd7a::2"], "Online": True},
        "nodekey:2": {"HostName": "laptop", "DNSName": "laptop.tail.ts.net.", "TailscaleIPs": ["100.64.0.3"], "Online": False},
        "nodekey:3": {"HostName": "noips", "Online": True},
    },
}


def test_parse_peer_forms_and_errors() -> None:
    assert parse_peer("10.0.0.1:8770") == PeerAddr("10.0.0.1:8770")
    assert parse_peer(" n1@host:1 ") == PeerAddr("host:1", "n1")
    assert parse_peer_list("a:1,b:2,") == [PeerAddr("a:1"), PeerAddr("b:2")]
    assert parse_peer_list(None) == []
    for bad in ["host", "host:", ":80", "host:99999", "host:x", "@h:1"]:
        with pytest.raises(ValueError, match="peer"):
            parse_peer(bad)


def test_parse_tailscale_status() -> None:
    peers = {p.host_name: p for p in parse_tailscale_status(STATUS)}
    assert peers["gpu-box"].dns_name == "gpu-box.tail.ts.net" and peers["gpu-box"].online
    assert peers["gpu-box"].ips == ("100.64.0.2", "fd7a::2") and not peers["laptop"].online
    assert parse_tailscale_status({}) == []
    with pytest.raises(ValueError):
        parse_tailscale_status([])
    with pytest.raises(ValueError):
        parse_tailscale_status({"Peer": []})


def fake_binary(tmp_path: Path, output: str) -> str:
    script = tmp_path / "tailscale"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}\nEOF\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


async def test_tailscale_source_lists_online_peers(tmp_path: Path) -> None:
    src = TailscaleSource(8770, binary=fake_binary(tmp_path, json.dumps(STATUS)))
    assert await src.peers() == [PeerAddr("100.64.0.2:8770")]
    assert src.enabled


@pytest.mark.parametrize("kind", ["missing", "bad-json"])
async def test_tailscale_source_disables_itself_with_one_log_line(tmp_path: Path, kind: str) -> None:
    binary = str(tmp_path / "nope") if kind == "missing" else fake_binary(tmp_path, "{not json")
    src = TailscaleSource(8770, binary=binary)
    with capture_logs() as logs:
        assert await src.peers() == []
        assert await src.peers() == []
    assert not src.enabled
    assert [entry["event"] for entry in logs] == ["tailscale discovery disabled"]


def test_mesh_config_section_and_voter_guard(tmp_path: Path) -> None:
    from app.config import ConfigError, load_settings
    from app.coordination.p2p.node import MeshNode

    cfg = tmp_path / "c.yaml"
    cfg.write_text("mesh:\n  profile: fast\n  voters: [a, b, c]\n  priority: 3\n  peers: ['b@h:1']\n")
    s = load_settings(cfg)
    assert s.mesh.timing_profile().heartbeat_interval == 0.15 and s.mesh.priority == 3
    node = MeshNode(s, node_id="a", secret="x")
    assert node.voters == ["a", "b", "c"] and node.pinned == {"b": "h:1"} and node.priority == 3
    cfg.write_text("mesh:\n  profile: bogus\n")
    with pytest.raises(ConfigError, match="unknown profile"):
        load_settings(cfg)
    with pytest.raises(ConfigError, match="voters"):
        MeshNode(node_id="a", peers=["h:1"], secret="x")


async def test_a_hung_tailscale_is_killed_at_the_timeout_and_asked_again_later(tmp_path: Path) -> None:
    script = tmp_path / "tailscale"
    script.write_text("#!/bin/sh\nexec sleep 30\n")  # exec: the timeout's kill reaches the sleeper itself
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    src = TailscaleSource(8770, binary=str(script), timeout=0.3)
    started = time.monotonic()
    with capture_logs() as logs:
        assert await src.peers() == []
    assert time.monotonic() - started < 5.0
    assert src.enabled  # a slow daemon is not a missing one: the next round asks again
    assert [entry["event"] for entry in logs] == ["tailscale status timed out; will retry"]
