"""The mesh side of the operator CLI: read /status and /progress, and send the signed admin
requests (rollback, transfer, drain), re-sent once to the leader a follower names."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from app.coordination.p2p.client import MeshClient

Answer = tuple[bool, Any]


class MeshAdmin:
    def __init__(self, client: MeshClient) -> None:
        self.client = client
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10))

    async def close(self) -> None:
        await self.http.close()
        await self.client.close()

    async def _get(self, addr: str, path: str) -> dict[str, Any]:
        async with self.http.get(f"http://{addr}{path}") as resp:
            resp.raise_for_status()
            return await resp.json()

    async def cluster_status(self, addr: str) -> dict[str, Any]:
        """The node's /status, and every peer's it lists (those that answer)."""
        first = await self._get(addr, "/status")
        peers = [p["addr"] for p in first.get("peers", []) if p.get("addr")]

        async def one(a: str) -> dict[str, Any] | None:
            try:
                return await self._get(a, "/status")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return None

        others = await asyncio.gather(*(one(a) for a in peers))
        nodes = [first] + [s for s in others if s is not None]
        unreachable = [a for a, s in zip(peers, others) if s is None]
        return {"nodes": sorted(nodes, key=lambda s: s["node_id"]), "unreachable": unreachable}

    async def progress(self, addr: str) -> dict[str, Any]:
        return await self._get(addr, "/progress")

    async def _to_leader(self, addr: str, path: str, body: dict[str, Any]) -> Answer:
        """POST to `addr`; a 503 naming the leader is re-sent there once."""
        status, answer = await self.client.request("POST", addr, path, body, timeout=30.0)
        if status == 503 and isinstance(answer, dict) and answer.get("leader_addr"):
            status, answer = await self.client.request("POST", answer["leader_addr"], path, body, timeout=30.0)
        return status == 200, answer

    async def rollback(self, addr: str, generation: int | None, reason: str) -> Answer:
        return await self._to_leader(addr, "/pipeline/rollback", {"generation": generation, "reason": reason})

    async def transfer(self, addr: str, target: str) -> Answer:
        return await self._to_leader(addr, "/admin/transfer", {"target": target})

    async def drain(self, addr: str) -> Answer:
        """Drain one node: if it leads, hand leadership to another live voter first (a healthy
        leader is never preempted otherwise), then ask it to drain and stop."""
        status = await self._get(addr, "/status")
        handed: Any = None
        if status.get("role") == "leader":
            others = [v for v in status.get("voters_alive", []) if v != status["node_id"]]
            if not others:
                return False, {"error": "the node leads and no other voter is alive to take over"}
            ok, handed = await self.transfer(addr, others[0])
            if not ok:
                return False, {"error": "leadership transfer failed", "transfer": handed}
        code, answer = await self.client.request("POST", addr, "/admin/drain", {}, timeout=10.0)
        return code in (200, 202), {"drain": answer, "transfer": handed}


def format_status(answer: dict[str, Any]) -> str:
    rows = [("node", "role", "term", "leader", "quorum", "voters", "gen", "games", "work")]
    for s in answer["nodes"]:
        inv = s.get("inventory", {})
        work = s.get("work") or {}
        rows.append((s["node_id"], s["role"], str(s["term"]), str(s.get("leader")), s.get("quorum_level", ""),
                     f"{len(s.get('voters_alive', []))}/{len(s.get('voters', []))}",
                     str(inv.get("best_generation", "")), str(inv.get("games_created", "")),
                     " ".join(f"{k}={v}" for k, v in work.items())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"unreachable: {a}" for a in answer.get("unreachable", [])]
    return "\n".join(lines)
