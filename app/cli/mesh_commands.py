"""The mesh side of the operator CLI: read /status and /progress (public: no signature, no
secret), and send the signed admin requests (rollback, transfer, drain), re-sent once to the
leader a follower names. Every failure becomes one line for a human (`describe_error`)."""

from __future__ import annotations

import asyncio
import re
import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp

from app.coordination.p2p.client import AnswerRefused, MeshClient

Answer = tuple[int, Any]  # (HTTP status, parsed answer)
_ADDRESS = re.compile(r"^(?:(?P<scheme>https?)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d{1,5})/?$")


@dataclass(frozen=True)
class NodeAddress:
    """A node's mesh API: `host:port`, `http://host:port` or `https://host:port`."""

    scheme: str
    addr: str  # host:port, as the mesh names peers

    @staticmethod
    def parse(text: str) -> "NodeAddress":
        m = _ADDRESS.match(text.strip())
        if m is None or not 0 < int(m["port"]) < 65536:
            raise ValueError(f"{text!r} is not a node address: expected host:port, http://host:port or "
                             "https://host:port (the mesh port, 8770 by default)")
        return NodeAddress(m["scheme"] or "http", f"{m['host']}:{m['port']}")

    def __str__(self) -> str:
        return self.addr if self.scheme == "http" else f"{self.scheme}://{self.addr}"


class CommandRefused(Exception):
    """A node answered, but not with what was asked for: one line saying why."""


class MeshAdmin:
    def __init__(self, node: NodeAddress, client: MeshClient | None = None, ssl_context: ssl.SSLContext | None = None,
                 timeout_s: float = 10.0) -> None:
        """`client` signs the admin commands; reads need none."""
        self.node = node
        self.client = client
        self.timeout_s = timeout_s
        self.ssl_context = ssl_context
        self._http: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        """Made on first use, inside the event loop that uses it."""
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                                               connector=aiohttp.TCPConnector(ssl=self.ssl_context or True))
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        if self.client is not None:
            await self.client.close()

    async def _get(self, addr: str, path: str) -> dict[str, Any]:
        async with self.http().get(f"{self.node.scheme}://{addr}{path}") as resp:
            if resp.status == 404 and await self._is_health_port(addr):
                raise CommandRefused(f"{addr} is a node's health port (8790 by default), not its mesh port: "
                                     "give --node the mesh port (8770 by default, node.mesh_port)")
            if resp.status != 200:
                raise CommandRefused(f"{addr}{path} answered HTTP {resp.status}: {(await resp.text())[:200]}")
            try:
                return await resp.json()
            except (aiohttp.ContentTypeError, ValueError):
                raise CommandRefused(f"{addr}{path} did not answer JSON: is this a node's mesh port "
                                     "(8770 by default, not the health port)?") from None

    async def _is_health_port(self, addr: str) -> bool:
        """The health server answers /livez and /daemons; the mesh API has no such routes."""
        try:
            async with self.http().get(f"{self.node.scheme}://{addr}/daemons") as resp:
                return resp.status == 200 and isinstance(await resp.json(), (dict, list))
        except (aiohttp.ClientError, ValueError):
            return False

    async def cluster_status(self) -> dict[str, Any]:
        """The node's /status, and every peer's it lists (those that answer)."""
        first = await self._get(self.node.addr, "/status")
        peers = [p["addr"] for p in first.get("peers", []) if p.get("addr")]

        async def one(a: str) -> dict[str, Any] | None:
            try:
                return await self._get(a, "/status")
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError, CommandRefused):
                return None

        others = await asyncio.gather(*(one(a) for a in peers))
        nodes = [first] + [s for s in others if s is not None]
        unreachable = [a for a, s in zip(peers, others) if s is None]
        return {"nodes": sorted(nodes, key=lambda s: s["node_id"]), "unreachable": unreachable}

    async def progress(self) -> dict[str, Any]:
        return await self._get(self.node.addr, "/progress")

    def _signing(self) -> MeshClient:
        if self.client is None:
            raise CommandRefused("this command is signed: no mesh secret was given")
        return self.client

    async def _to_leader(self, path: str, body: dict[str, Any]) -> Answer:
        """POST to the node; a 503 naming the leader is re-sent there once."""
        client = self._signing()
        status, answer = await client.request("POST", self.node.addr, path, body, timeout=30.0)
        if status == 503 and isinstance(answer, dict) and answer.get("leader_addr"):
            status, answer = await client.request("POST", answer["leader_addr"], path, body, timeout=30.0)
        return status, answer

    async def rollback(self, generation: int | None, reason: str) -> Answer:
        return await self._to_leader("/pipeline/rollback", {"generation": generation, "reason": reason})

    async def transfer(self, target: str) -> Answer:
        return await self._to_leader("/admin/transfer", {"target": target})

    async def drain(self) -> Answer:
        """Drain one node: if it leads others, hand leadership to another live voter first (a
        healthy leader is never preempted otherwise), then ask it to drain and stop. A lone node
        (its own only voter, as `make run` starts one) has no one to hand over to and just stops."""
        status = await self._get(self.node.addr, "/status")
        handed: Any = None
        if status.get("role") == "leader" and status.get("voters") != [status.get("node_id")]:
            others = [v for v in status.get("voters_alive", []) if v != status["node_id"]]
            if not others:
                return 409, {"error": "the node leads and no other voter is alive to take over"}
            code, handed = await self.transfer(others[0])
            if code != 200:
                return code, {"error": f"leadership transfer failed: {_reason(handed)}", "transfer": handed}
        code, answer = await self._signing().request("POST", self.node.addr, "/admin/drain", {}, timeout=10.0)
        return (200 if code in (200, 202) else code), {"drain": answer, "transfer": handed}


def _reason(answer: Any) -> str:
    if isinstance(answer, dict) and answer.get("error"):
        return str(answer["error"])
    return str(answer)[:200]


SECRET_HINT = ("sign with the cluster's secret: MESH_SECRET or MESH_SECRET_FILE, mesh.secret_file in --config, "
               "or run beside the node's data dir (data/mesh_secret, or --data-dir)")


def refusal_line(node: NodeAddress, status: int, answer: Any) -> str:
    """One line for a signed command the node refused."""
    if status == 401:
        return f"{node} refused the signature ({_reason(answer)}): {SECRET_HINT}"
    return f"{node} refused the command (HTTP {status}): {_reason(answer)}"


def describe_error(exc: BaseException, node: NodeAddress, timeout_s: float) -> str:
    """One human line for a failure to talk to a node: never a repr."""
    if isinstance(exc, CommandRefused):
        return str(exc)
    if isinstance(exc, AnswerRefused) and "signature" in str(exc):  # the node signs with a key we do not hold
        return f"{node} signs with another secret than this command's (its answer does not check): {SECRET_HINT}"
    if isinstance(exc, (asyncio.TimeoutError, TimeoutError, aiohttp.ServerTimeoutError)):
        return f"{node} did not answer within {timeout_s:.0f} s"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return f"cannot reach {node}: its TLS certificate is not trusted ({exc.certificate_error}); " \
               "give the cluster's TLS settings with --config"
    if isinstance(exc, aiohttp.ClientSSLError):
        return f"cannot reach {node}: TLS failed ({getattr(exc, 'os_error', exc)})"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error
        if isinstance(os_error, ConnectionRefusedError):
            return f"cannot reach {node}: connection refused (is a node running there? the mesh port is 8770 by default)"
        if "Name or service not known" in str(os_error) or "nodename nor servname" in str(os_error) \
                or type(exc).__name__ == "ClientConnectorDNSError":
            return f"cannot reach {node}: unknown host {exc.host!r}"
        return f"cannot reach {node}: {os_error.strerror or os_error}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"{node} closed the connection without answering (is it the mesh port, and plain HTTP or TLS as given?)"
    if isinstance(exc, aiohttp.ClientResponseError):
        return f"{node} answered HTTP {exc.status}: {exc.message}"
    if isinstance(exc, aiohttp.ClientError):
        return f"cannot talk to {node}: {exc.__class__.__name__.replace('Client', '').replace('Error', '').lower() or 'error'}" \
               f"{': ' + str(exc) if str(exc) else ''}"
    if isinstance(exc, OSError):
        return f"cannot reach {node}: {exc.strerror or exc}"
    return f"{node}: {exc}"


def format_status(answer: dict[str, Any]) -> str:
    rows = [("node", "role", "term", "leader", "quorum", "voters", "ready", "gen", "games", "under-repl", "work")]
    for s in answer["nodes"]:
        inv = s.get("inventory", {})
        work = s.get("work") or inv.get("work") or {}
        ready = inv.get("ready")
        rows.append((s["node_id"], s["role"], str(s["term"]), str(s.get("leader")), s.get("quorum_level", ""),
                     f"{len(s.get('voters_alive', []))}/{len(s.get('voters', []))}",
                     "-" if ready is None else ("yes" if ready else "no"),
                     _text(inv.get("best_generation")), _text(inv.get("games_created")), _under_replicated(inv),
                     " ".join(f"{k}={v}" for k, v in work.items())))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines += [f"unreachable: {a}" for a in answer.get("unreachable", [])]
    return "\n".join(lines)


def format_progress(answer: dict[str, Any]) -> str:
    """The decided generations with their Elo (95 % interval) and solved-position accuracy,
    then the best: the same facts as `--json`."""
    rows = [("gen", "result", "model", "elo", "95% interval", "exact", "outcome", "trained by", "reason")]
    rolled_back = set(answer.get("rolled_back", []))
    for g in answer.get("generations", []):
        result = "rolled back" if g.get("rolled_back") or g["generation"] in rolled_back else \
            ("promoted" if g["promoted"] else "rejected, trained on" if g.get("head") else "rejected")
        accuracy = g.get("accuracy") or {}
        interval = "-" if g.get("elo_low") is None else f"[{g['elo_low']:.0f}, {g['elo_high']:.0f}]"
        rows.append((str(g["generation"]), result, g["sha256"][:12], _number(g.get("elo"), "{:.0f}"), interval,
                     _number(accuracy.get("exact"), "{:.1%}"), _number(accuracy.get("outcome"), "{:.1%}"),
                     str(g.get("trained_by", "")), str(g.get("reason", ""))[:60]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows] if len(rows) > 1 \
        else ["no decided generation yet"]
    best = answer.get("current_best")
    if answer.get("anchor"):
        lines.append(f"Elo relative to: {answer['anchor']} (0)")
    lines.append(f"best: generation {answer.get('best_generation', 0)} ({best[:12] if best else 'untrained'})")
    allocation = answer.get("allocation") or {}
    for name, config in (answer.get("configs") or {}).items():  # several configs: one line each
        share = (allocation.get("shares") or {}).get(name)
        lines.append(f"config {name} ({config.get('game')}): best generation {config.get('best_generation') or 0}, "
                     f"share {_number(share, '{:.3f}')}: {(allocation.get('reasons') or {}).get(name, '')}")
    return "\n".join(lines)


def config_progress(answer: Any, name: str | None) -> tuple[int, Any]:
    """(200, /progress) or, with `name`, (200, that config's part with its share and reason), or
    (404, why) naming the configs the node runs."""
    if name is None:
        return 200, answer
    configs = answer.get("configs") if isinstance(answer, dict) else None
    if not isinstance(configs, dict):
        return 404, {"error": f"this node runs one config: `progress` without --config shows it, not {name!r}"}
    if name not in configs:
        return 404, {"error": f"no config {name!r} on this node; it runs {sorted(configs)}"}
    allocation = answer.get("allocation") or {}
    return 200, {**configs[name], "config": name,
                 "share": (allocation.get("shares") or {}).get(name),
                 "reason": (allocation.get("reasons") or {}).get(name)}


def _under_replicated(inventory: dict[str, Any]) -> str:
    """A node's own games on fewer nodes than the replication factor, and the oldest one's age
    ("-": the node replicates nothing, e.g. a lone node)."""
    rep = inventory.get("replication")
    if not isinstance(rep, dict) or rep.get("under_replicated") is None:
        return "-"
    n, oldest = rep["under_replicated"], rep.get("oldest_under_replicated_s")
    return f"{n}(oldest:{oldest:.0f}s)" if n and isinstance(oldest, (int, float)) else str(n)


def _text(value: Any) -> str:
    return "-" if value is None else str(value)


def _number(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)
