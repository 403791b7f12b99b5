"""Where peers come from: static config, `--peers`, and `tailscale status --json`.

Tailscale's `Online` only means the peer talks to the control plane; it is used to pick
addresses worth trying, never as liveness (that comes from our own gossip).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from app.log import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class PeerAddr:
    addr: str  # host:port
    node_id: str | None = None  # set for "id@host:port": pins this id to this address


def parse_peer(text: str) -> PeerAddr:
    """'host:port' or 'node_id@host:port'; raises ValueError with a readable message."""
    text = text.strip()
    node_id: str | None = None
    if "@" in text:
        node_id, text = text.split("@", 1)
        if not node_id:
            raise ValueError(f"peer {text!r}: empty node id before '@'")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"peer {text!r}: expected host:port")
    return PeerAddr(f"{host}:{int(port)}", node_id)


def parse_peer_list(items: list[str] | str | None) -> list[PeerAddr]:
    if not items:
        return []
    if isinstance(items, str):
        items = [p for p in items.split(",") if p.strip()]
    return [parse_peer(p) for p in items]


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class TailscalePeer:
    host_name: str
    dns_name: str
    ips: tuple[str, ...]
    online: bool


def parse_tailscale_status(data: Any) -> list[TailscalePeer]:
    """Peers from the `Peer` map of `tailscale status --json`; unknown shapes -> ValueError."""
    if not isinstance(data, dict):
        raise ValueError("tailscale status: top level is not an object")
    peers = data.get("Peer")
    if peers is None:  # no peers yet (or logged out)
        peers = {}
    if not isinstance(peers, dict):
        raise ValueError("tailscale status: 'Peer' is not an object")
    out = []
    for entry in peers.values():
        if not isinstance(entry, dict):
            continue
        ips = entry.get("TailscaleIPs") or []
        out.append(
            TailscalePeer(
                host_name=str(entry.get("HostName", "")),
                dns_name=str(entry.get("DNSName", "")).rstrip("."),
                ips=tuple(str(ip) for ip in ips if isinstance(ip, str)),
                online=bool(entry.get("Online", False)),
            )
        )
    return out


class TailscaleSource:
    """Runs `tailscale status --json` with a timeout; disables itself after one log line
    when the binary is missing or its output cannot be parsed."""

    def __init__(self, port: int, binary: str = "tailscale", timeout: float = 5.0) -> None:
        self.port = port
        self.binary = binary
        self.timeout = timeout
        self.enabled = True

    async def peers(self) -> list[PeerAddr]:
        if not self.enabled:
            return []
        try:
            proc = await asyncio.create_subprocess_exec(
                self.binary, "status", "--json",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )
        except (FileNotFoundError, PermissionError) as exc:
            return self._disable(f"tailscale binary unavailable: {exc}")
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), self.timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            log.warning("tailscale status timed out; will retry", timeout=self.timeout)
            return []
        try:
            found = parse_tailscale_status(json.loads(out))
        except (ValueError, json.JSONDecodeError) as exc:
            return self._disable(f"tailscale status output unusable: {exc}")
        return [PeerAddr(host_port(p.ips[0], self.port)) for p in found if p.online and p.ips]

    def _disable(self, why: str) -> list[PeerAddr]:
        self.enabled = False
        log.warning("tailscale discovery disabled", reason=why)
        return []
