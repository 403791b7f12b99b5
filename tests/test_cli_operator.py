"""`python -m app.cli` as a new operator runs it against a live lone node: with no environment
at all (`env -i`), reads need no secret, a signed command finds the node's own secret beside
its data dir, `--node` takes a URL, text agrees with `--json`, and every failure is one line."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.db.registry import MatchGame, ModelRegistry
from app.games import get_game
from app.games.train.gauntlet import recompute_ratings
from tests.mesh_helpers import free_ports
from tests.ops_cluster import LIGHT_DAEMONS
from tests.orchestrator_helpers import SMALL_CONFIG, get_json, start_node, stop_nodes, tail, wait_until, write_node_files

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
GAME = get_game("connect4")


def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """The CLI with no environment but what is given (`env -i`)."""
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=60, env=env or {})


def one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.stdout == "" and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    assert "Error(" not in lines[0] and "Traceback" not in proc.stderr, lines[0]  # never a repr
    return lines[0]


def seed_registry(data_dir: Path, work: Path) -> list[str]:
    """Three promoted generations, each candidate having played only the previous best (the
    default run's gauntlet), rated as the gauntlet rates them."""
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    shas: list[str] = []
    with ModelRegistry(data_dir / "registry.db") as registry:
        for g in (1, 2, 3):
            path = work / f"gen{g}.safetensors"
            meta = save_model(new_model(arch, seed=g), ModelMeta(arch, GAME.name, g, shas[-1] if shas else None), path)
            registry.register(meta.sha256, str(path), g, shas[-1] if shas else None)
            registry.promote(meta.sha256, "pass: no gate configured")
            if shas:
                registry.add_match_games([MatchGame(f"{g:016x}-model:{shas[-1]}:s4-{i}", f"{g:016x}", "connect4",
                                                    f"model:{meta.sha256}:s4", f"model:{shas[-1]}:s4",
                                                    0 if i < 13 else 1, "44", 2) for i in range(20)])
            shas.append(meta.sha256)
        recompute_ratings(registry, net_simulations=4)
    return shas


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_node")
    files = write_node_files(root / "solo", "solo", SMALL_CONFIG, LIGHT_DAEMONS)
    shas = seed_registry(files.data_dir, root)
    proc = start_node(files, env={"MESH_SECRET": "", "MESH_SECRET_FILE": ""})  # the node makes data/mesh_secret
    try:
        wait_until(lambda: files.health("/readyz")[0] == 200, 90, what="ready")
        wait_until(lambda: files.state().get("best_sha256") == shas[-1], 60, what="the node on generation 3")
        wait_until(lambda: (get_json(files.mesh_port, "/status") or {}).get("role") == "leader", 60, what="leading")
        yield files, shas
    except AssertionError:
        print(tail(files))
        raise
    finally:
        stop_nodes([proc], timeout=35)


def test_reads_need_no_secret_and_text_agrees_with_json(node, tmp_path) -> None:
    files, shas = node
    url = f"http://127.0.0.1:{files.mesh_port}"
    for args in (["status", "--node", url], ["--json", "status", "--node", url + "/"]):
        proc = cli(*args, cwd=tmp_path)  # not beside the data dir, no environment: reads are public
        assert proc.returncode == 0, proc.stderr
    status = json.loads(cli("--json", "status", "--node", url, cwd=tmp_path).stdout)
    [me] = status["nodes"]
    text = cli("status", "--node", url, cwd=tmp_path).stdout.splitlines()
    header, row = text[0].split(), text[1].split()
    columns = dict(zip(header, row))
    assert columns["node"] == "solo" and columns["ready"] == "yes"
    assert columns["gen"] == str(me["inventory"]["best_generation"]) == "3"
    assert columns["games"] == str(me["inventory"]["games_created"])

    progress = json.loads(cli("--json", "progress", "--node", url, cwd=tmp_path).stdout)
    assert progress["best_generation"] == 3 and [g["generation"] for g in progress["generations"]] == [1, 2, 3]
    assert progress["generations"][0]["elo"] == 0.0 and progress["generations"][2]["elo"] > 0
    lines = cli("progress", "--node", url, cwd=tmp_path).stdout.splitlines()
    assert lines[-1] == f"best: generation 3 ({shas[-1][:12]})"
    # no game against random was played: the Elo is relative to generation 1, and says so
    assert lines[-2] == "Elo relative to: generation 1 (0)" and progress["anchor"] == "generation 1"
    rows = [line.split() for line in lines[1:-2]]
    assert [r[0] for r in rows] == ["1", "2", "3"] and all(r[1] == "promoted" for r in rows)
    assert [r[3] for r in rows] == [f"{g['elo']:.0f}" for g in progress["generations"]]


def test_a_signed_command_finds_the_nodes_own_secret_beside_its_data_dir(node, tmp_path) -> None:
    files, _ = node
    addr = f"127.0.0.1:{files.mesh_port}"
    # beside the data dir (./data/mesh_secret): the signature is accepted; the lone node already
    # leads, so the transfer itself is refused, with the node's reason on one line
    beside = cli("transfer", "--to", "solo", "--node", addr, cwd=files.root)
    assert beside.returncode == 1 and "already the leader" in one_error_line(beside)
    assert cli("--json", "transfer", "--to", "solo", "--node", addr, cwd=files.root).returncode == 1
    # elsewhere: no secret at all is a clear error before anything is sent
    nowhere = cli("transfer", "--to", "solo", "--node", addr, cwd=tmp_path)
    assert nowhere.returncode == 2 and "no mesh secret" in one_error_line(nowhere)
    assert "--data-dir" in one_error_line(nowhere)
    named = cli("--data-dir", str(files.data_dir), "transfer", "--to", "solo", "--node", addr, cwd=tmp_path)
    assert "already the leader" in one_error_line(named)
    # the wrong secret: the node's signed answer does not check (or the node refuses with a
    # 401), one line with the hint of where the right secret comes from
    wrong = cli("transfer", "--to", "solo", "--node", addr, cwd=tmp_path, env={"MESH_SECRET": "not-the-secret"})
    line = one_error_line(wrong)
    assert wrong.returncode == 1 and "MESH_SECRET" in line
    assert "signs with another secret" in line or "refused the signature" in line, line


def test_connection_flags_go_before_or_after_and_the_health_port_gets_a_hint(node, tmp_path) -> None:
    files, _ = node
    addr = f"127.0.0.1:{files.mesh_port}"
    before = cli("--node", addr, "--timeout", "20", "--json", "status", cwd=tmp_path)  # as etcdctl users type it
    after = cli("status", "--node", addr, "--timeout", "20", "--json", cwd=tmp_path)
    assert before.returncode == after.returncode == 0, before.stderr + after.stderr
    assert [n["node_id"] for n in json.loads(before.stdout)["nodes"]] == ["solo"]
    health = cli("--node", f"127.0.0.1:{files.health_port}", "status", cwd=tmp_path)
    line = one_error_line(health)
    assert health.returncode == 1 and "health port" in line and "8770" in line, line


def test_every_failure_is_one_human_line(tmp_path) -> None:
    [closed] = free_ports(1)
    refused = cli("status", "--node", f"127.0.0.1:{closed}", cwd=tmp_path)
    assert refused.returncode == 1 and "connection refused" in one_error_line(refused)
    bad = cli("status", "--node", "ftp://127.0.0.1:8770", cwd=tmp_path)
    assert bad.returncode == 2 and "not a node address" in bad.stderr and "Traceback" not in bad.stderr
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        slow = cli("--timeout", "1", "progress", "--node", f"http://127.0.0.1:{port}", cwd=tmp_path)
    assert slow.returncode == 1 and f"127.0.0.1:{port} did not answer within 1 s" in one_error_line(slow)


def test_a_lone_node_drains_from_beside_its_data_dir(tmp_path) -> None:
    """`make run`'s node is its own only voter: drain has no one to hand leadership to and
    stops it (it once refused with 409, leaving an operator only a signal)."""
    files = write_node_files(tmp_path / "solo", "solo", SMALL_CONFIG, LIGHT_DAEMONS)
    proc = start_node(files, env={"MESH_SECRET": "", "MESH_SECRET_FILE": ""})
    try:
        wait_until(lambda: (get_json(files.mesh_port, "/status") or {}).get("role") == "leader", 90, what="leading")
        drained = cli("--json", "drain", "--node", f"127.0.0.1:{files.mesh_port}", cwd=files.root)
        assert drained.returncode == 0, drained.stderr
        assert json.loads(drained.stdout)["drain"]["draining"] is True
        assert proc.wait(timeout=40) == 0
        events = [json.loads(line).get("event") for line in (files.root / "node.log").read_text().splitlines()
                  if line.startswith("{")]
        assert {"drain_requested", "drain_started", "daemons_stopped"} <= set(events)  # an operator sees the drain
    except AssertionError:
        print(tail(files))
        raise
    finally:
        stop_nodes([proc], timeout=35)
