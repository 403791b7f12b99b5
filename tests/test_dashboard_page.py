"""The dashboard page in a real headless Chromium, served by the real health server from a
snapshot the test controls (the `dashboard` callable the orchestrator hands the server): the
header degrades when any voter is not ready, and on a 390 px phone no table is cut off."""

from __future__ import annotations

import asyncio
import time

import pytest

from app.config import Settings
from app.coordination.daemons.event_router import EventRouter
from app.coordination.daemons.health_server import HealthServer
from app.coordination.daemons.manager import DaemonManager
from app.coordination.daemons.daemon_registry import build_registry
from tests.cdp import Browser
from tests.ops_tools import require_tool

pytestmark = pytest.mark.timeout(180)
SHA = "0123456789abcdef" * 4
IDS = ["node-alpha-1", "node-beta-2", "node-gamma-3"]


async def _worker(ctx) -> None:
    ctx.mark_healthy()
    await ctx.stopping.wait()


def snapshot(not_ready: set[str]) -> dict:
    """A three-voter cluster as the feed reports it: all alive, quorum healthy, 14 generations."""
    return {
        "cluster": {"leader": IDS[0], "term": 12, "quorum_level": "healthy", "voters": IDS, "voters_alive": IDS,
                    "voters_not_ready": sorted(not_ready), "quorum_size": 2},
        "nodes": [{"node_id": n, "self": i == 0, "voter": True, "role": "leader" if i == 0 else "follower", "term": 12,
                   "quorum_level": "healthy", "health": "alive", "ready": n not in not_ready,
                   "ready_reason": "critical daemon selfplay gave up" if n in not_ready else "",
                   "generation": 14, "model": SHA, "games": 123456, "games_per_s": 3.21, "claims": []}
                  for i, n in enumerate(IDS)],
        "work": {"pending": 1}, "claims": [{"item": "training:generation-15", "node": IDS[1], "term": 12}],
        "generations": [{"generation": g, "sha256": SHA, "promoted": True, "rolled_back": False, "trained_by": IDS[0],
                         "elo": 10.0 * g, "elo_low": 10.0 * g - 30, "elo_high": 10.0 * g + 30, "loss": 2.0 - 0.05 * g,
                         "accuracy": {"exact": 0.4 + 0.01 * g, "outcome": 0.7},
                         "reason": "pass: no gate configured (every candidate is promoted; the gauntlet only measures)"}
                        for g in range(1, 15)],
        # two configs on the cluster (app/config/configs.py): the scheduler's shares and why
        "configs": {"c4": {"game": "connect4", "weight": 1.0, "best_generation": 14,
                           "generations": [{"generation": 14, "promoted": True, "elo": 140.0}]},
                    "small": {"game": "connect4_5x4", "weight": 1.0, "best_generation": 3, "generations": []}},
        "allocation": {"shares": {"c4": 0.7, "small": 0.3}, "progress": {"c4": 120.5, "small": None},
                       "regressing": ["small"],
                       "reasons": {"c4": "share 0.700: progress 120.5 Elo/CPU-h, stale 0.10 h, weight 1",
                                   "small": "share 0.300: progress not measured yet (optimistic), stale 0.20 h, "
                                            "weight 1, regressing (Elo 10 < peak 80 - 30): boost x2"}},
        "series": [{"t": time.time() - 60 + i, "games": 100 + i, "positions": 1000 + 10 * i} for i in range(60)],
        # a language model's panel (app/lm/workload/dashboard_panel.py): the trainer and a rollout node
        "workload": {"training": [
            {"node_id": IDS[0], "step": 17, "sft_step": None, "policy_version": 15, "staleness": 1, "mean_reward": 0.62,
             "remote_groups": 3, "loss": -0.01, "trains_from": {"model": "head", "generation": 13, "sha256": SHA},
             "heldout": [{"step": 10, "reward": 0.81, "exact_match": 0.8}]},
            {"node_id": IDS[1], **{k: None for k in ("step", "sft_step", "policy_version", "staleness", "mean_reward",
                                                     "remote_groups", "loss")},
             "trains_from": {"model": "best", "generation": 12, "sha256": SHA}, "heldout": []}],
            "heldout": [{"generation": g, "sha256": SHA, "reward": 0.5 + 0.02 * g, "low": 0.4 + 0.02 * g,
                         "high": 0.6 + 0.02 * g, "promoted": g % 3 == 0} for g in range(0, 15)]},
    }


@pytest.fixture
async def served():
    """(url, set of not-ready node ids the next snapshot reports)."""
    require_tool("chromium")
    router = EventRouter()
    registry = build_registry({"daemons": {"worker": {"critical": True}}}, {"worker": (_worker, {})})
    manager = DaemonManager(registry.select("all"), router=router, settings=Settings())
    not_ready: set[str] = set()
    server = HealthServer(manager, router.metrics, port=0, dashboard=lambda: snapshot(not_ready))
    await server.start()
    await manager.start()
    try:
        yield server.url, not_ready
    finally:
        await manager.drain_and_stop(5)
        await server.stop()


HEADER = """(() => { const h = document.getElementById('header');
                     return document.body.dataset.loaded ? [h.classList.contains('degraded'),
                            document.getElementById('state').textContent] : null; })()"""


async def test_the_header_degrades_while_a_voter_is_alive_but_not_ready(served) -> None:
    url, not_ready = served
    async with Browser(width=1280, height=1200) as browser:
        await browser.open(f"{url}/")
        assert await browser.wait_for(HEADER, 30, "the header") == [False, "healthy"]
        not_ready.add(IDS[1])
        await browser.open(f"{url}/")
        await asyncio.sleep(0.2)
        degraded, state = await browser.wait_for(HEADER, 30, "the header")
        assert degraded and state == f"degraded: {IDS[1]} not ready"
        cells = await browser.eval("[...document.querySelectorAll('#nodes .readiness')].map(e => e.textContent)")
        assert cells == ["ready", "not ready", "ready"]
        assert await browser.eval("document.querySelectorAll('#accuracy tbody tr').length") == 14
        assert await browser.eval("[...document.querySelectorAll('#configs .config-name')].map(e => e.textContent)") \
            == ["c4", "small"]
        assert await browser.eval("document.getElementById('lm-section').hidden") is False
        assert await browser.eval("document.querySelectorAll('#lm-training tbody tr').length") == 2
        assert await browser.eval("document.getElementById('chart-heldout').dataset.points") == "10"  # rejected: most


async def test_no_table_is_cut_off_on_a_phone(served) -> None:
    url, _ = served
    async with Browser(width=390, height=844) as browser:
        await browser.open(f"{url}/", width=390, height=844, mobile=True)
        await browser.wait_for("document.body.dataset.loaded", 30, "the page")
        # every table fits the width of its box (no hidden columns to scroll to) and every cell
        # ends inside the viewport; the page itself does not scroll sideways either
        widths = await browser.eval("""[...document.querySelectorAll('table')].map(t =>
            [t.id, t.getBoundingClientRect().width, t.parentElement.clientWidth,
             Math.max(...[...t.querySelectorAll('td, th')].filter(c => c.offsetParent)
                      .map(c => c.getBoundingClientRect().right))])""")
        for table_id, width, box, right in widths:
            assert width <= box + 1 and right <= 390, (table_id, width, box, right)
        assert {w[0] for w in widths} == {"nodes", "accuracy", "daemons", "claims", "generations", "configs", "lm-training"}
        assert await browser.eval("document.documentElement.scrollWidth <= window.innerWidth + 1")
        # each cell says what it is, the header row being hidden
        assert await browser.eval("document.querySelector('#generations td').dataset.label") == "gen"
