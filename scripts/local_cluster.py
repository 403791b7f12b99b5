#!/usr/bin/env python
"""Run N real mesh nodes on 127.0.0.1 and watch them: a live status table polled from each
node's GET /status. Ctrl-C (or SIGTERM) stops every node: SIGTERM, then SIGKILL after a grace.

    python scripts/local_cluster.py --nodes 3                  # full nodes: the training loop
    python scripts/local_cluster.py --nodes 5 --mesh-only      # the mesh alone

Each node gets its own port and data dir (<data-root>/nK) and all nodes are voters. The
command receives --node-id --host --port --data-dir --peers --voters --priority --profile,
and full orchestrator nodes also --health-port (and --config/--daemons when given).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.live import Live
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.free_ports import free_ports  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--mesh-only", action="store_true", help="run bare mesh nodes (python -m app.coordination.p2p)")
    p.add_argument("--command", default=None, help="node command (default: the orchestrator, or the mesh with --mesh-only)")
    p.add_argument("--config", default=None, help="node config YAML passed to every orchestrator node")
    p.add_argument("--daemons", default=None, help="daemons file passed to every orchestrator node")
    p.add_argument("--profile", default="fast", choices=["lan", "wan", "fast"])
    p.add_argument("--base-port", type=int, default=0, help="first port (0: pick free ports)")
    p.add_argument("--data-root", default="data/local_cluster")
    p.add_argument("--interval", type=float, default=0.5, help="status poll interval, seconds")
    p.add_argument("--duration", type=float, default=0.0, help="stop after this many seconds (0: run until Ctrl-C)")
    p.add_argument("--extra", default="", help="extra arguments for every node, e.g. '--demo-work 8'")
    args = p.parse_args(argv)
    if args.nodes < 1:
        p.error("--nodes must be at least 1")
    if args.command is None:
        module = "app.coordination.p2p" if args.mesh_only else "app.p2p_orchestrator"
        args.command = f"{sys.executable} -m {module}"
    return args


class LocalCluster:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        n = args.nodes
        self.ids = [f"n{i}" for i in range(n)]
        self.ports = [args.base_port + i for i in range(n)] if args.base_port else free_ports(n)
        self.health_ports = free_ports(n)
        self.root = Path(args.data_root)
        self.procs: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.env.setdefault("MESH_SECRET", secrets.token_hex(16))

    def addr(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def start(self) -> None:
        for i, nid in enumerate(self.ids):
            data_dir = self.root / nid
            data_dir.mkdir(parents=True, exist_ok=True)
            peers = ",".join(f"{self.ids[j]}@{self.addr(j)}" for j in range(len(self.ids)) if j != i)
            cmd = shlex.split(self.args.command) + [
                "--node-id", nid, "--host", "127.0.0.1", "--port", str(self.ports[i]),
                "--data-dir", str(data_dir), "--voters", ",".join(self.ids),
                "--priority", str(i), "--profile", self.args.profile,
            ] + (["--peers", peers] if peers else []) + self._orchestrator_args(i) + shlex.split(self.args.extra)
            log = open(data_dir / "node.log", "ab")  # noqa: SIM115 - closed when the child exits
            self.procs[nid] = subprocess.Popen(
                cmd, cwd=ROOT, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
            log.close()
            print(f"started {nid} pid={self.procs[nid].pid} addr={self.addr(i)} data={data_dir}", flush=True)

    def _orchestrator_args(self, i: int) -> list[str]:
        if "p2p_orchestrator" not in self.args.command:
            return []
        extra = ["--health-port", str(self.health_ports[i])]
        for flag in ("config", "daemons"):
            if getattr(self.args, flag):
                extra += [f"--{flag}", getattr(self.args, flag)]
        return extra

    def stop(self, grace: float = 10.0) -> None:
        for proc in self.procs.values():
            _signal_group(proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _signal_group(proc, signal.SIGKILL)
                proc.wait(timeout=5)
        print("all nodes stopped", flush=True)

    async def poll(self, session: aiohttp.ClientSession) -> dict[str, dict | None]:
        async def one(i: int) -> dict | None:
            try:
                async with session.get(f"http://{self.addr(i)}/status", timeout=aiohttp.ClientTimeout(total=1)) as r:
                    return await r.json() if r.status == 200 else None
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                return None
        results = await asyncio.gather(*(one(i) for i in range(len(self.ids))))
        return dict(zip(self.ids, results))

    def table(self, statuses: dict[str, dict | None]) -> Table:
        t = Table(title=f"mesh: {len(self.ids)} nodes, profile {self.args.profile}")
        for col in ("node", "pid", "addr", "role", "term", "leader", "quorum", "alive voters", "peers a/s/d", "work",
                    "gen", "games"):
            t.add_column(col)
        for i, nid in enumerate(self.ids):
            proc = self.procs[nid]
            st = statuses.get(nid)
            if st is None:
                state = "exited" if proc.poll() is not None else "no answer"
                t.add_row(nid, str(proc.pid), self.addr(i), f"[red]{state}[/red]", *[""] * 8)
                continue
            counts = {k: sum(1 for p in st["peers"] if p["state"] == k) for k in ("alive", "suspect", "dead")}
            role = st["role"]
            style = {"leader": "bold green", "candidate": "yellow"}.get(role, "")
            work = st.get("work") or {}
            t.add_row(
                nid, str(proc.pid), self.addr(i), f"[{style}]{role}[/{style}]" if style else role,
                str(st["term"]), str(st["leader"]), st["quorum_level"],
                f"{len(st['voters_alive'])}/{len(st['voters'])}",
                f"{counts['alive']}/{counts['suspect']}/{counts['dead']}",
                " ".join(f"{k}={v}" for k, v in work.items()) if work else "",
                str(st.get("inventory", {}).get("best_generation", "")),
                str(st.get("inventory", {}).get("games_created", "")),
            )
        return t


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


async def watch(cluster: LocalCluster, stop: asyncio.Event) -> None:
    console = Console()
    deadline = time.monotonic() + cluster.args.duration if cluster.args.duration else None
    async with aiohttp.ClientSession() as session:
        if console.is_terminal:
            with Live(cluster.table({}), console=console, refresh_per_second=4) as live:
                while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                    live.update(cluster.table(await cluster.poll(session)))
                    await _sleep_or_stop(stop, cluster.args.interval)
        else:  # not a terminal: one summary line per poll
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                sts = await cluster.poll(session)
                line = " ".join(f"{nid}={plain_status(s)}" for nid, s in sts.items())
                print(f"status {line}", flush=True)
                await _sleep_or_stop(stop, cluster.args.interval)


def plain_status(st: dict | None) -> str:
    """role@term, plus generation and games for full nodes: the table's story on one line."""
    if not st:
        return "down"
    inv = st.get("inventory", {})
    extra = f",gen{inv['best_generation']},games{inv['games_created']}" if "games_created" in inv else ""
    return f"{st['role']}@{st['term']}{extra}"


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except asyncio.TimeoutError:
        pass


async def amain(args: argparse.Namespace) -> int:
    cluster = LocalCluster(args)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        cluster.start()
        await watch(cluster, stop)
    finally:
        cluster.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(amain(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
