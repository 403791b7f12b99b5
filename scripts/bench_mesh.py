#!/usr/bin/env python
"""Mesh benchmark; prints ONE JSON object.

* failover, per timing profile: a 5-voter cluster of real processes on loopback; the leader is
  killed with SIGKILL `--kills` times (it is restarted and the cluster settles in between).
  detection_s = kill -> first survivor reports the leader SUSPECT (or has dropped it as leader);
  failover_s  = kill -> a survivor reports itself leader in a higher term.
* gossip convergence, 7 real processes: every node knows only n0's address; time until every
  node lists the other 6 as alive; then a node is killed and rejoins with a new incarnation,
  timed until everyone has its new state (seconds, and gossip rounds at the profile's interval).
* gossip convergence, simulated: `--sim-nodes` Membership tables in one process with the real
  merge code, fanout from the profile; rounds to full membership from a ring, and rounds for
  one node's update to reach everyone.
* the cost of signed answers (issue 45), side by side in one run, for three variants:
  `unsigned_answers` (the shared secret, with answer signing and checking patched out in the
  bench's processes: the wire before issue 45), `shared` (the shared secret, answers signed
  and checked) and `node_keys` (per-node ECDSA keys from the cluster tool, answers signed and
  checked): signed requests per second against one node in this process, and the CPU
  milliseconds a request costs (client and server share the process, so this is the whole cost
  of a request, and CPU time is far less swayed than requests/s by others' work on the
  machine), the medians of `--signing-rounds` interleaved rounds; and the failover of 5 voters
  on the fast profile (`--signing-kills` leader kills each).

* quorum certificates (issue 54; `scripts/bench_mesh_certs.py`): CPU per gossip round and per
  decision with certificates beside the revision before them, in one run (`--cert-rounds`),
  and leader changes of three full nodes on this machine per profile (`--churn`).

    python scripts/bench_mesh.py --profiles fast,lan,wan --kills 10
    python scripts/bench_mesh.py --profiles "" --gossip-profile "" --sim-nodes --signing-kills 5
    python scripts/bench_mesh.py --profiles "" --gossip-profile "" --sim-nodes --signing-seconds 0 \
        --signing-kills 5 --variants node_keys --cert-rounds 3 --churn fast --churn-seconds 300
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config.mesh import PROFILES  # noqa: E402
from app.coordination.p2p.membership import Membership  # noqa: E402
from app.coordination.p2p.tls import init_ca  # noqa: E402
from app.coordination.p2p.schemas import NodeState  # noqa: E402
from app.free_ports import free_ports  # noqa: E402

SECRET = "bench-mesh-secret"
VARIANTS = ("unsigned_answers", "shared", "node_keys")
# Run in a node process (variant unsigned_answers): the mesh as it answered before issue 45,
# answers neither signed by the server nor checked by the client.
UNSIGNED_PATCH = """
import runpy, sys
import app.coordination.p2p.client as client
import app.coordination.p2p.server as server
from app.coordination.p2p.auth import BOOT_HEADER, NODE_HEADER, TO_HEADER
server.answer_headers = lambda *a, **k: {}
def check(self, addr, request_headers, status, headers, body, **_):
    node, boot = headers.get(NODE_HEADER), headers.get(BOOT_HEADER)
    if node and boot and boot.isdigit():
        self.peers[addr] = (node, int(boot))
    return node or request_headers.get(TO_HEADER) or ""
client.MeshClient.check = check
"""


class Proc:
    def __init__(self, node_id: str, port: int, data_dir: Path, args: list[str]) -> None:
        self.node_id, self.port, self.data_dir, self.args = node_id, port, data_dir, args
        self.proc: subprocess.Popen | None = None

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    variant = "shared"

    def start(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "MESH_SECRET": SECRET, "PYTHONPATH": str(ROOT)}
        if self.variant == "unsigned_answers":
            run = UNSIGNED_PATCH + "sys.argv = ['p2p', *sys.argv[1:]]\nrunpy.run_module('app.coordination.p2p', run_name='__main__')"
            cmd = [sys.executable, "-c", run, *self.args]
        else:
            cmd = [sys.executable, "-m", "app.coordination.p2p", *self.args]
        with open(self.data_dir / "node.log", "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def make_cluster(root: Path, n: int, profile: str, pinned: bool, variant: str = "shared") -> list[Proc]:
    ports = free_ports(n)
    ids = [f"n{i}" for i in range(n)]
    procs = []
    if variant == "node_keys":
        init_ca(root / "certs", ids)
    for i in range(n):
        if pinned:
            peers = ",".join(f"{ids[j]}@127.0.0.1:{ports[j]}" for j in range(n) if j != i)
        else:  # discovery by gossip from one seed
            peers = f"127.0.0.1:{ports[0]}" if i else ""
        args = ["--node-id", ids[i], "--host", "127.0.0.1", "--port", str(ports[i]),
                "--data-dir", str(root / ids[i]), "--voters", ",".join(ids), "--priority", str(i),
                "--profile", profile, "--log-level", "WARNING"]
        if peers:
            args += ["--peers", peers]
        if variant == "node_keys":
            config = root / f"{ids[i]}.yaml"
            certs = root / "certs"
            config.write_text(json.dumps({"mesh": {"node_keys": {
                "ca_file": str(certs / "ca.pem"), "cert_file": str(certs / f"{ids[i]}.pem"),
                "key_file": str(certs / f"{ids[i]}.key")}}}))
            args += ["--config", str(config)]
        proc = Proc(ids[i], ports[i], root / ids[i], args)
        proc.variant = variant
        procs.append(proc)
    return procs


async def status(session: aiohttp.ClientSession, p: Proc) -> dict | None:
    try:
        async with session.get(f"http://{p.addr}/status", timeout=aiohttp.ClientTimeout(total=1.0)) as r:
            return await r.json() if r.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
        return None


async def statuses(session: aiohttp.ClientSession, procs: list[Proc]) -> dict[str, dict]:
    res = await asyncio.gather(*(status(session, p) for p in procs))
    return {p.node_id: s for p, s in zip(procs, res) if s}


async def until(cond, timeout: float, interval: float = 0.05):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = await cond()
        if value:
            return value
        await asyncio.sleep(interval)
    raise TimeoutError("condition not met")


async def settled(session: aiohttp.ClientSession, procs: list[Proc]) -> tuple[str, int] | None:
    sts = await statuses(session, procs)
    if len(sts) != len(procs):
        return None
    leaders = [(nid, s["term"]) for nid, s in sts.items() if s["role"] == "leader"]
    if len(leaders) != 1 or not all(s["leader"] == leaders[0][0] and s["quorum_level"] == "healthy"
                                    for s in sts.values()):
        return None
    return leaders[0]


async def bench_failover(profile: str, kills: int, variant: str = "shared") -> dict:
    t = PROFILES[profile]
    detection: list[float] = []
    failover: list[float] = []
    with tempfile.TemporaryDirectory(prefix=f"mesh-bench-{profile}-") as tmp:
        procs = make_cluster(Path(tmp), 5, profile, pinned=True, variant=variant)
        async with aiohttp.ClientSession() as session:
            try:
                for p in procs:
                    p.start()
                for _ in range(kills):
                    leader_id, term = await until(lambda: settled(session, procs), 20 + 6 * t.dead_after, 0.1)
                    await asyncio.sleep(t.gossip_interval * 2)
                    victim = next(p for p in procs if p.node_id == leader_id)
                    rest = [p for p in procs if p is not victim]
                    victim.kill()
                    t0 = time.monotonic()
                    detected = elected = None
                    while elected is None and time.monotonic() - t0 < 6 * t.failover_aim:
                        sts = await statuses(session, rest)
                        now = time.monotonic() - t0
                        if detected is None and any(
                            s["leader"] != leader_id
                            or any(pr["node_id"] == leader_id and pr["state"] != "alive" for pr in s["peers"])
                            for s in sts.values()
                        ):
                            detected = now
                        if any(s["role"] == "leader" and s["term"] > term for s in sts.values()):
                            elected = now
                            detected = detected if detected is not None else now
                        await asyncio.sleep(0.02)
                    if elected is None:
                        raise RuntimeError(f"{profile}: no new leader after killing {leader_id}")
                    detection.append(detected)  # type: ignore[arg-type]
                    failover.append(elected)
                    victim.start()
            finally:
                for p in procs:
                    p.kill()

    def summary(xs: list[float]) -> dict:
        return {"median_s": round(statistics.median(xs), 3), "max_s": round(max(xs), 3),
                "min_s": round(min(xs), 3), "n": len(xs)}
    return {
        "kills": kills, "detection": summary(detection), "failover": summary(failover),
        "aims": {"detection_s": t.detection_aim, "failover_s": t.failover_aim},
        "within_aims": max(detection) <= t.detection_aim and max(failover) <= t.failover_aim,
    }


async def bench_gossip_processes(profile: str, n: int = 7, rejoins: int = 5) -> dict:
    """Initial join from one seed, then `rejoins` times: kill -9 the last node, restart it
    (new incarnation, knowing only n0's address) and time from its first /status answer until
    every node has its new incarnation as alive and it lists all others as alive."""
    t = PROFILES[profile]
    with tempfile.TemporaryDirectory(prefix="mesh-bench-gossip-") as tmp:
        procs = make_cluster(Path(tmp), n, profile, pinned=False)
        async with aiohttp.ClientSession() as session:
            try:
                for p in procs:
                    p.start()
                await until(lambda: _all_answer(session, procs), 60, 0.02)
                t0 = time.monotonic()
                await until(lambda: _converged(session, procs, None, 0), 60, 0.02)
                initial = time.monotonic() - t0
                joiner = procs[-1]
                samples = []
                for _ in range(rejoins):
                    old = (await status(session, joiner) or {}).get("incarnation", 0)
                    joiner.kill()
                    joiner.start()
                    await until(lambda: status(session, joiner), 30, 0.01)
                    t0 = time.monotonic()
                    await until(lambda: _converged(session, procs, joiner.node_id, old), 60, 0.02)
                    samples.append(time.monotonic() - t0)
            finally:
                for p in procs:
                    p.kill()
    med = statistics.median(samples)
    return {
        "nodes": n, "profile": profile, "gossip_interval_s": t.gossip_interval, "fanout": t.gossip_fanout,
        "initial_join_s": round(initial, 3),
        "rejoin": {"median_s": round(med, 3), "max_s": round(max(samples), 3), "n": len(samples),
                   "median_rounds": round(med / t.gossip_interval, 1)},
    }


async def _converged(session: aiohttp.ClientSession, procs: list[Proc], joiner: str | None, old_inc: int) -> bool:
    sts = await statuses(session, procs)
    if len(sts) != len(procs):
        return False
    for nid, s in sts.items():
        alive = {pr["node_id"]: pr for pr in s["peers"] if pr["state"] == "alive"}
        if len(alive) != len(procs) - 1:
            return False
        if joiner is not None and nid != joiner and alive[joiner]["incarnation"] <= old_inc:
            return False
    return True


async def _all_answer(session: aiohttp.ClientSession, procs: list[Proc]) -> bool:
    return len(await statuses(session, procs)) == len(procs)


def bench_gossip_simulated(n: int, fanout: int, interval: float, seed: int = 1) -> dict:
    rng = random.Random(seed)
    nodes = [Membership(NodeState(node_id=f"s{i:04d}"), 1e9, 2e9, 0.0) for i in range(n)]
    for i, m in enumerate(nodes):
        m.merge_state(nodes[(i + 1) % n].local, 0.0)
    by_id = {m.node_id: m for m in nodes}

    def round_() -> None:
        """Synchronous round: every exchange carries the state as it was at the round's start,
        so news travels at most one hop per round (real, asynchronous gossip is no slower)."""
        for m in nodes:
            m.tick()
        snapshot = {m.node_id: m.message(0.0) for m in nodes}
        for m in nodes:
            for peer in m.choose_targets(fanout, 0.0, rng):
                by_id[peer].merge(snapshot[m.node_id], 0.0)
                m.merge(snapshot[peer], 0.0)

    t0 = time.perf_counter()
    join_rounds = 0
    while not all(len(m.peers) == n - 1 for m in nodes):
        round_()
        join_rounds += 1
    join_cpu = time.perf_counter() - t0
    nodes[0].update_local(inventory={"model": "gen-42"})
    t1 = time.perf_counter()
    rumor_rounds = 0
    while not all(m.state_of(nodes[0].node_id).inventory.get("model") == "gen-42" for m in nodes[1:]):  # type: ignore[union-attr]
        round_()
        rumor_rounds += 1
    rumor_cpu = time.perf_counter() - t1
    return {
        "nodes": n, "fanout": fanout,
        "join_from_ring": {"rounds": join_rounds, "seconds_at_interval": round(join_rounds * interval, 2),
                           "sim_cpu_s": round(join_cpu, 2)},
        "update_spread": {"rounds": rumor_rounds, "seconds_at_interval": round(rumor_rounds * interval, 2),
                          "sim_cpu_s": round(rumor_cpu, 2)},
        "interval_s": interval,
    }


async def bench_requests(variant: str, seconds: float, concurrency: int = 8) -> dict:
    """Signed requests a second against one lone node in this process: POST /gossip (a signed
    request, a signed answer carrying the node's signed state) and GET /status (public, its
    answer signed for our client)."""
    from app.config import Settings
    from app.config.mesh import MeshConfig, TlsConfig
    from app.coordination.p2p import client as client_mod
    from app.coordination.p2p import server as server_mod
    from app.coordination.p2p.client import MeshClient
    from app.coordination.p2p.identity import NodeKey
    from app.coordination.p2p.node import MeshNode

    saved = (server_mod.answer_headers, client_mod.MeshClient.check)
    if variant == "unsigned_answers":
        exec(UNSIGNED_PATCH, {})  # noqa: S102 - the bench's own patch, undone below
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="mesh-bench-requests-") as tmp:
        settings, key = Settings(), SECRET.encode()
        if variant == "node_keys":
            certs = Path(tmp) / "certs"
            init_ca(certs, ["solo", "bench"])
            files = lambda nid: TlsConfig(ca_file=certs / "ca.pem", cert_file=certs / f"{nid}.pem",  # noqa: E731
                                          key_file=certs / f"{nid}.key")
            settings = Settings().model_copy(update={"mesh": MeshConfig(node_keys=files("solo"))})
            key = NodeKey(files("bench"))  # type: ignore[assignment]
        node = MeshNode(settings, node_id="solo", host="127.0.0.1", port=0, data_dir=Path(tmp) / "solo",
                        profile="fast", secret=SECRET.encode())
        await node.start()
        client = MeshClient(key, timeout=5.0, node_id="bench")
        try:
            for name, call in (("gossip", lambda: client.request("POST", node.addr, "/gossip",
                                                                 {"sender": "bench", "states": []})),
                               ("status", lambda: client.request("GET", node.addr, "/status"))):
                done = 0

                async def worker() -> None:
                    nonlocal done
                    while time.perf_counter() < end:
                        status_code, _ = await call()
                        assert status_code == 200, status_code
                        done += 1
                await call()  # warm: identify, connection
                t0, cpu0 = time.perf_counter(), time.process_time()
                end = t0 + seconds
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                # CPU per request (client and node both in this process): what signing costs,
                # and far less swayed than requests/s by others' work on a shared machine
                out[name] = {"per_s": round(done / (time.perf_counter() - t0), 1),
                             "cpu_ms": round(1000 * (time.process_time() - cpu0) / max(done, 1), 3)}
        finally:
            await client.close()
            await node.stop()
            server_mod.answer_headers, client_mod.MeshClient.check = saved
    return out


async def amain(args: argparse.Namespace) -> dict:
    out: dict = {"bench": "mesh", "host_cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
                 "failover": {}, "gossip": {}}
    for profile in [p for p in args.profiles.split(",") if p]:
        print(f"failover: profile {profile}, {args.kills} kills ...", file=sys.stderr, flush=True)
        out["failover"][profile] = await bench_failover(profile, args.kills)
    if args.gossip_profile:
        print("gossip: 7 processes ...", file=sys.stderr, flush=True)
        out["gossip"]["processes_7"] = await bench_gossip_processes(args.gossip_profile)
    if args.signing_kills or args.signing_seconds:
        signing: dict = {"requests": {}, "failover_fast": {}}
        if args.signing_seconds:  # rounds with the variants interleaved, a different one first each round
            rounds: dict[str, list[dict]] = {v: [] for v in VARIANTS}
            for r in range(args.signing_rounds):
                for variant in VARIANTS[r % 3:] + VARIANTS[:r % 3]:
                    print(f"signing: round {r + 1}, {variant} ...", file=sys.stderr, flush=True)
                    rounds[variant].append(await bench_requests(variant, args.signing_seconds / args.signing_rounds))
            signing["requests"] = {v: {kind: {m: statistics.median(x[kind][m] for x in rs) for m in ("per_s", "cpu_ms")}
                                        for kind in ("gossip", "status")} for v, rs in rounds.items()}
            signing["requests_rounds"] = rounds
        for variant in [v for v in args.variants.split(",") if v]:
            if args.signing_kills:
                print(f"signing: {variant}, failover ...", file=sys.stderr, flush=True)
                signing["failover_fast"][variant] = await bench_failover("fast", args.signing_kills, variant)
        out["signing"] = signing
    if args.cert_rounds or args.churn:
        from bench_mesh_certs import bench_certificates, bench_churn  # scripts/, beside this file

        if args.cert_rounds:
            out["certificates"] = bench_certificates(args.cert_rounds, 30, 6.0, "244f21b")
        out["churn"] = [bench_churn(profile, args.churn_seconds) for profile in args.churn.split(",") if profile]
    lan = PROFILES["lan"]
    for n in args.sim_nodes:
        print(f"gossip: {n} simulated nodes ...", file=sys.stderr, flush=True)
        out["gossip"][f"simulated_{n}"] = bench_gossip_simulated(n, lan.gossip_fanout, lan.gossip_interval)
    return out


def main(argv: list[str] | None = None) -> int:
    from app.log import configure_logging

    configure_logging("bench", "WARNING", json=True)  # the in-process nodes log to stderr: stdout is the JSON
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profiles", default="fast,lan,wan")
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--gossip-profile", default="lan")
    p.add_argument("--sim-nodes", type=int, nargs="*", default=[100, 250])
    p.add_argument("--signing-seconds", type=float, default=5.0, help="per variant and request kind (0: skip)")
    p.add_argument("--signing-rounds", type=int, default=5, help="interleaved rounds the signing seconds are split into")
    p.add_argument("--signing-kills", type=int, default=5, help="leader kills per variant (0: skip)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="the failover variants of --signing-kills")
    p.add_argument("--cert-rounds", type=int, default=0, help="certificates' CPU beside 244f21b (0: skip)")
    p.add_argument("--churn", default="", help="profiles for leader changes of 3 full nodes ('': skip)")
    p.add_argument("--churn-seconds", type=float, default=300.0)
    args = p.parse_args(argv)
    print(json.dumps(asyncio.run(amain(args)), indent=None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
