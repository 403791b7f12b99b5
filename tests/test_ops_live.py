"""What operators see, against one live 3-node cluster (shared by the tests of this module):
the dashboard in a real headless Chromium, and a real Prometheus server scraping every node.

The cluster starts with OPS_GENERATIONS (default 2) promoted generations already decided
(tests/ops_cluster.py: no training run on a 2-core machine); the mesh, quorum, daemons, gossip,
dashboard and metrics are all live. The screenshot goes to the test's tmp dir, or to
OPS_SCREENSHOT (docs/dashboard.png was taken of a real training cluster, see docs/).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.cdp import Browser
from tests.mesh_helpers import free_ports
from tests.ops_cluster import IDS, make_nodes, seed_generations, start
from tests.ops_tools import require_tool
from tests.orchestrator_helpers import ROOT, get_json, stop_nodes, tail, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

GENERATIONS = int(os.environ.get("OPS_GENERATIONS", "2"))


@pytest.fixture(scope="module")
def chromium() -> str:
    return require_tool("chromium")


@pytest.fixture(scope="module")
def prometheus() -> str:
    return require_tool("prometheus")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three orchestrator nodes, all voters, every one on the newest seeded generation."""
    root = tmp_path_factory.mktemp("ops_cluster")
    nodes = make_nodes(root)
    seeded = seed_generations(nodes, root, GENERATIONS)
    env_secret = os.environ.get("MESH_SECRET")
    os.environ["MESH_SECRET"] = secrets.token_hex(16)
    procs = []
    try:
        procs = [start(files, i, nodes) for i, files in enumerate(nodes)]
        try:
            wait_until(lambda: all(f.health("/readyz")[0] == 200 for f in nodes), 120, what="every node ready")
            wait_until(lambda: all(f.state().get("best_sha256") == seeded.shas[-1] for f in nodes), 120,
                       what="every node on the newest generation")
        except AssertionError:
            for files in nodes:
                print(f"--- {files.root.name}\n{tail(files, 3000)}")
            raise
        yield nodes
    finally:
        stop_nodes(procs, timeout=35)
        if env_secret is None:
            os.environ.pop("MESH_SECRET", None)
        else:
            os.environ["MESH_SECRET"] = env_secret


async def test_dashboard_draws_every_node_and_a_generation_chart(chromium, cluster, tmp_path):
    shot = Path(os.environ.get("OPS_SCREENSHOT") or tmp_path / "dashboard.png")
    files = cluster[1]  # any node serves the whole cluster's view
    async with Browser(width=1280, height=1500) as browser:
        await browser.open(f"http://127.0.0.1:{files.health_port}/")
        # every node is a row of the cluster table, drawn by the page's script from live data
        drawn = await browser.wait_for(
            """(() => { const ids = [...document.querySelectorAll('#nodes .node-id')].map(e => e.textContent);
                        return ids.length ? ids : null; })()""", 60, "the cluster table")
        assert sorted(drawn) == IDS
        # the Elo chart has a point per decided generation (an SVG circle each) and its interval,
        # learned by gossip from n0, the node that rated them; the loss chart likewise
        try:
            points = await browser.wait_for(
                f"""(() => {{ const n = document.querySelectorAll('#chart-elo svg circle.point').length;
                              const i = document.querySelectorAll('#chart-elo svg line.interval').length;
                              return n >= {GENERATIONS} && i >= {GENERATIONS} ? n : 0; }})()""", 90, "the Elo chart")
        except AssertionError:  # what the page was fed, and what n0 (the rater) gossips
            view = get_json(files.health_port, "/dashboard.json") or {}
            print("generations served:", json.dumps(view.get("generations"))[:3000])
            status = get_json(cluster[0].mesh_port, "/status") or {}
            print("n0 gen_stats:", json.dumps((status.get("inventory") or {}).get("gen_stats"))[:2000])
            raise
        assert points == GENERATIONS
        assert await browser.wait_for("document.querySelectorAll('#chart-loss svg circle.point').length", 30,
                                      "the loss chart") == GENERATIONS
        # one leader, once the page has refreshed past any election (it redraws every 5 s)
        roles = await browser.wait_for(
            """(() => { const r = [...document.querySelectorAll('#nodes tbody tr td:nth-child(2)')]
                                  .map(e => e.textContent);
                        return r.filter(x => x === 'leader').length === 1 ? r : null; })()""", 60, "one leader")
        assert sorted(roles) == ["follower", "follower", "leader"], roles
        assert await browser.eval("document.querySelectorAll('#daemons tbody tr').length") == 2
        assert await browser.eval("document.getElementById('error').textContent") == ""
        shot.parent.mkdir(parents=True, exist_ok=True)
        await browser.screenshot(shot)
        # readable on a phone: no horizontal overflow of the page itself at 390 px
        await browser.open(f"http://127.0.0.1:{files.health_port}/", width=390, height=844, mobile=True)
        await browser.wait_for("document.querySelectorAll('#nodes .node-id').length === 3", 60, "phone layout")
        assert await browser.eval("document.documentElement.scrollWidth <= window.innerWidth + 1")
    assert shot.stat().st_size > 10_000 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _query(port: int, promql: str) -> list[dict]:
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            body = json.loads(resp.read())
    except OSError:
        return []
    return body["data"]["result"] if body.get("status") == "success" else []


def test_prometheus_scrapes_every_node(prometheus, cluster, tmp_path):
    [port] = free_ports(1)
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["scrape_configs"][0]["static_configs"] = [
        {"targets": [f"127.0.0.1:{f.health_port}" for f in cluster]}]
    config["rule_files"] = [str(ROOT / "deploy" / "alerts.yml")]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def nodes_of(promql: str) -> set[str]:
            return {r["metric"].get("node") for r in _query(port, promql)}

        try:
            wait_until(lambda: nodes_of("mesh_term") == set(IDS), 90, interval=0.5, what="mesh_term of every node")
        except AssertionError:
            print((tmp_path / "prometheus.log").read_text(errors="replace")[-3000:])
            raise
        for metric in ("mesh_selfplay_games_total", "mesh_voters_alive", "mesh_daemon_state", "mesh_ready",
                       "mesh_best_model_installed_timestamp_seconds", "mesh_build_info",
                       "process_resident_memory_bytes", 'mesh_model_elo{role="best"}'):
            wait_until(lambda: nodes_of(metric) == set(IDS), 30, interval=0.5, what=f"{metric} of every node")
        assert {r["metric"]["instance"] for r in _query(port, "up == 1")} == \
            {f"127.0.0.1:{f.health_port}" for f in cluster}
        leaders = _query(port, "sum(mesh_is_leader)")
        assert leaders and float(leaders[0]["value"][1]) == 1.0
        wait_until(lambda: [float(r["value"][1]) for r in _query(port, "mesh_cluster_best_generation")]
                   == [GENERATIONS] * 3, 30, interval=0.5, what="every node's cluster best generation")
        # the shipped rules load, and a healthy cluster pages nobody
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/v1/rules", timeout=3) as resp:
            groups = json.loads(resp.read())["data"]["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        assert {"MeshNoLeader", "MeshQuorumBelowMajority", "MeshCriticalDaemonGaveUp", "MeshNoPromotion",
                "MeshSelfplayStalled", "MeshNodeDown", "MeshQuorumLost"} <= names
        firing = [r for r in _query(port, 'ALERTS{alertstate="firing"}')
                  if r["metric"]["alertname"] in ("MeshNoLeader", "MeshQuorumBelowMajority",
                                                  "MeshCriticalDaemonGaveUp", "MeshNodeDown", "MeshQuorumLost")]
        assert firing == []
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
