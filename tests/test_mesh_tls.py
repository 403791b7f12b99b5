"""Optional TLS with a cluster CA (issue 11): the CLI makes the CA and node certificates, nodes
elect a leader over mutual TLS, a request whose signed sender differs from its certificate is
refused, and a client without a certificate from the CA cannot connect."""

from __future__ import annotations

import asyncio
import json
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from app.config import ConfigError, Settings
from app.config.mesh import MeshConfig, TlsConfig
from app.coordination.p2p.auth import sign
from app.coordination.p2p.node import MeshNode
from app.coordination.p2p.tls import client_context
from tests.mesh_helpers import ROOT, free_ports, wait_for

pytestmark = pytest.mark.timeout(120)
SECRET = b"tls-test-secret"
IDS = ["n0", "n1", "n2"]


def tls_for(certs: Path, node_id: str) -> TlsConfig:
    return TlsConfig(ca_file=certs / "ca.pem", cert_file=certs / f"{node_id}.pem", key_file=certs / f"{node_id}.key")


def settings_for(certs: Path, node_id: str, cert_of: str | None = None) -> Settings:
    return Settings().model_copy(update={"mesh": MeshConfig(tls=tls_for(certs, cert_of or node_id))})


async def test_nodes_lead_over_mutual_tls_and_a_certificate_speaks_for_one_node_only(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    done = subprocess.run([sys.executable, "-m", "app.coordination.p2p.tls", "init", "--dir", str(certs),
                           "--nodes", ",".join([*IDS, "mallory"])], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert (certs / "ca.pem").exists() and (certs / "n0.key").stat().st_mode & 0o077 == 0
    with pytest.raises(ConfigError, match="certificate names n1"):
        MeshNode(settings_for(certs, "n0", cert_of="n1"), node_id="n0", data_dir=tmp_path / "x", secret=SECRET)

    ports = free_ports(3)
    nodes = [MeshNode(settings_for(certs, IDS[i]), node_id=IDS[i], host="127.0.0.1", port=ports[i],
                      data_dir=tmp_path / IDS[i], peers=[f"{IDS[j]}@127.0.0.1:{ports[j]}" for j in range(3) if j != i],
                      voters=IDS, priority=i, profile="fast", secret=SECRET) for i in range(3)]
    for n in nodes:
        await n.start()
    try:
        async def led() -> MeshNode | None:
            leads = [n for n in nodes if n.is_leader]
            return leads[0] if len(leads) == 1 and all(n.leader_id == leads[0].node_id for n in nodes) else None
        leader = await wait_for(led, 20.0)
        follower = next(n for n in nodes if n is not leader)

        # mallory holds a CA certificate and the cluster secret, and claims to be the leader
        raw = json.dumps({"term": leader.term + 1, "leader_id": leader.node_id}).encode()
        headers = sign(SECRET, "POST", "/heartbeat", raw, sender=leader.node_id, receiver=follower.node_id,
                       boot=follower.boot)
        conn = aiohttp.TCPConnector(ssl=client_context(tls_for(certs, "mallory")))
        async with aiohttp.ClientSession(connector=conn) as s:
            async with s.post(f"https://{follower.addr}/heartbeat", data=raw, headers=headers) as r:
                data = await r.json()
                assert r.status == 401 and "certificate names mallory" in data["error"], data
        assert follower.term == leader.term

        # without a certificate from the cluster CA there is no connection at all
        bare = ssl.create_default_context(cafile=str(certs / "ca.pem"))
        bare.check_hostname = False
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=bare)) as s:
            with pytest.raises((aiohttp.ClientError, ssl.SSLError, asyncio.TimeoutError)):
                async with s.get(f"https://{follower.addr}/status", timeout=aiohttp.ClientTimeout(total=5)) as r:
                    await r.read()
    finally:
        for n in nodes:
            await n.stop()
