"""Start real orchestrator processes on small settings, and read what they left on disk."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from app.config.mesh import PROFILES, TimingProfile
from app.coordination.daemons.worker_metrics import descendants
from tests.mesh_helpers import free_ports

ROOT = Path(__file__).resolve().parents[1]

SMALL_CONFIG = {
    "model": {"channels": 16, "blocks": 1},
    "search": {"simulations": 16},
    # collect_workers 1: two test files' nodes share the two cores, so no node takes a second
    # core for self-play while it collects (test_event_flow.py tests that it would)
    "selfplay": {"concurrent_games": 32, "collect_workers": 1},
    "train": {"batch_size": 128, "epochs": 2},
    "gauntlet": {"games_vs_baseline": 8, "max_games_vs_best": 16, "net_simulations": 8},
    # 0.0: these runs test the mesh and the pipeline, not strength, so every generation is
    # promoted and no rejected one forces another round (test_promotion.py tests the gates)
    "promotion": {"min_score_vs_random": 0.0, "min_score_vs_heuristic": None},
}

# The smallest generation that still goes through every stage: for tests about what happens
# around a generation (claims, decisions, restarts), not about the network's strength.
# Self-play inline (`workers: 0`): a worker process imports torch and numba and loads the
# search kernel (~5 CPU s a node start, two per node with two configs) for a few dozen tiny
# games; test_dashboard_e2e.py runs the default worker process, tests/test_selfplay*.py
# its stops and orphans.
TINY_CONFIG = {**SMALL_CONFIG, "model": {"channels": 8, "blocks": 1}, "search": {"simulations": 4},
               "selfplay": {"concurrent_games": 16, "collect_workers": 1, "workers": 0},
               "train": {"batch_size": 64, "epochs": 1},
               "gauntlet": {**SMALL_CONFIG["gauntlet"], "games_vs_baseline": 4, "shard_games": 2,
                            "max_games_vs_best": 2, "net_simulations": 2}}


# Self-play rests this long after each batch. These runs test the mesh and the pipeline; games
# are only a means, and two test files' nodes share two cores, so self-play must not starve the
# torchrun, gauntlet and mesh processes the tests wait on. Measured on the one-node e2e test:
# 49.0 CPU s with a 1 s rest, 39.4 with 3 s (docs/benchmarks/suite.md); a batch of 16-32
# tiny games still comes every few seconds, far more than a generation's 24-60 needs.
SELFPLAY_REST_S = 3.0


def tiny_selfplay(batch_games: int) -> dict:
    """The self-play daemon of a TINY_CONFIG node: 4 simulations, a rest after each batch."""
    return {"critical": True, "stop_timeout_s": 15,
            "settings": {"batch_games": batch_games, "simulations": 4, "rest_s": SELFPLAY_REST_S}}


# Mesh timing for several voters on a machine whose cores are busy with other work: the `fast`
# profile's 0.8 s lease and 0.5 s requests make three loaded voters flap (every leader change
# loses the training claims), so tests about the pipeline across a leader change use this.
BUSY_CPU_TIMING = {**PROFILES["fast"].model_dump(), "heartbeat_interval": 0.3, "suspect_after": 2.0,
                   "dead_after": 6.0, "election_timeout_min": 2.5, "election_timeout_spread": 1.0,
                   "leader_lease": 2.0, "request_timeout": 2.0, "bully_patience": 6.0, "claim_ttl": 20.0}
TimingProfile(**BUSY_CPU_TIMING)  # valid (lease < election timeout, ...) or the import fails here

SMALL_DAEMONS = {
    "restart": {"base_s": 0.5, "cap_s": 5},
    "daemons": {
        "dlq_retry": {},
        "selfplay": {"critical": True, "stop_timeout_s": 15,
                     "settings": {"batch_games": 32, "simulations": 16, "rest_s": SELFPLAY_REST_S}},
        "export": {"critical": True, "settings": {"min_new_games": 60, "poll_s": 0.5}},
        "train": {"depends_on": ["export"], "critical": True, "stop_timeout_s": 15, "settings": {"poll_s": 0.5}},
        "gauntlet": {"depends_on": ["train"], "critical": True, "settings": {"poll_s": 0.5}},
        "promote": {"depends_on": ["gauntlet"], "critical": True, "settings": {"poll_s": 0.5}},
        "distribution": {"critical": True, "settings": {"poll_s": 0.5}},
    },
}


@dataclass
class NodeFiles:
    root: Path
    config: Path
    daemons: Path
    data_dir: Path
    health_port: int
    mesh_port: int

    def state(self) -> dict:
        path = self.data_dir / "pipeline_state.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def health(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}{path}", timeout=2) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except OSError:  # not listening (yet, or any more)
            return 0, b""


def write_node_files(root: Path, node_id: str = "solo", config: dict | None = None,
                     daemons: dict | None = None) -> NodeFiles:
    root.mkdir(parents=True, exist_ok=True)
    health_port, mesh_port = free_ports(2)
    data_dir = root / "data"
    cfg = {**(config or SMALL_CONFIG),
           "node": {"node_id": node_id, "data_dir": str(data_dir), "health_port": health_port, "mesh_port": mesh_port}}
    (root / "config.yaml").write_text(yaml.safe_dump(cfg))
    (root / "daemons.yaml").write_text(yaml.safe_dump(daemons or SMALL_DAEMONS))
    return NodeFiles(root, root / "config.yaml", root / "daemons.yaml", data_dir, health_port, mesh_port)


def start_node(files: NodeFiles, *extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """The real orchestrator in its own session, so a test can kill everything it started;
    `env` adds variables (a test fault point, a secret) to this process's environment."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    log = open(files.root / "node.log", "ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app.p2p_orchestrator", "--config", str(files.config),
         "--daemons", str(files.daemons), *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )


def wait_until(predicate, timeout: float, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"{what} not reached within {timeout}s")


def group_alive(pgid: int) -> bool:
    """A live (not zombie) process is left in the group: killpg(0) also counts zombies, which
    stay until whoever inherited them reaps them (not always promptly in a container)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def signal_descendants(procs: list[subprocess.Popen], sig: int) -> None:
    """Send `sig` to every process below each node (its self-play workers, forked from the
    node's forkserver: app/games/worker_processes.py): SIGSTOP pauses production while the nodes
    themselves keep serving and replicating."""
    for proc in procs:
        for pid in descendants(proc.pid):
            try:
                os.kill(int(pid), sig)
            except ProcessLookupError:
                pass


def kill_group(proc: subprocess.Popen) -> None:
    """Cleanup: SIGKILL the node's whole process group, whatever is left of it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def stop_nodes(procs, timeout: float = 30.0) -> None:
    """SIGTERM every node still running (they drain in parallel), wait, then SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
        kill_group(proc)


def tail(files: NodeFiles, n: int = 4000) -> str:
    path = files.root / "node.log"
    return path.read_text(errors="replace")[-n:] if path.exists() else ""


def get_json(port: int, path: str) -> dict | None:
    """GET a node's JSON endpoint on 127.0.0.1; None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as resp:
            return json.loads(resp.read())
    except OSError:
        return None


def start_voter(nodes: list[NodeFiles], ids: list[str], i: int, *extra: str,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """Node `i` of a cluster where every node votes and knows the others (priority = index)."""
    peers = ",".join(f"{ids[j]}@127.0.0.1:{nodes[j].mesh_port}" for j in range(len(ids)) if j != i)
    return start_node(nodes[i], "--voters", ",".join(ids), "--peers", peers, "--priority", str(i),
                      "--profile", "fast", *extra, env=env)


def leader_of(nodes: list[NodeFiles]) -> str | None:
    """The node id of the leader, as the first node that says it leads tells (None: none yet)."""
    for files in nodes:
        status = get_json(files.mesh_port, "/status")
        if status and status.get("role") == "leader":
            return status["node_id"]
    return None


# What a test about running nodes may raise while it waits on them: a state not reached, a node
# not answering, a file read while it is being replaced, a record missing.
NODE_FAILURES: tuple[type[BaseException], ...] = (AssertionError, OSError, ValueError, KeyError, StopIteration)


@contextmanager
def nodes_running(nodes: Iterable[NodeFiles], procs: Mapping[str, subprocess.Popen] | list[subprocess.Popen], *,
                  stop_timeout: float = 30.0, kill: bool = False, tail_chars: int = 3000) -> Iterator[None]:
    """The body of a test that runs nodes: on a failure every node's log tail is printed (a node
    that never reached a state says why only there), and whatever happens every node is stopped
    (drained with SIGTERM, or `kill`ed when draining would change what the test reads after).
    `procs` is read when the block ends, so nodes the body restarts are stopped too: change it
    in place (a new dict bound to the same name is not seen, and its nodes would outlive the test)."""
    nodes = list(nodes)
    try:
        yield
    except NODE_FAILURES:
        for files in nodes:
            print(f"--- {files.root.name}\n{tail(files, tail_chars)}")
        raise
    finally:
        running = list(procs.values()) if isinstance(procs, Mapping) else list(procs)
        if kill:
            for proc in running:
                kill_group(proc)
        else:
            stop_nodes(running, timeout=stop_timeout)
