"""A default single node, as `make run` starts one (no promotion gate: each candidate plays only
the previous best; self-play in its worker process), on tiny networks: ready and live, then
after two promotions its dashboard, in a real headless Chromium, charts an Elo point per
generation (rated against the fixed anchor) and lists each promoted model's exact-move and
outcome accuracy on the solver-scored positions; /progress and /metrics say the same, the page
reflows on a phone, and a SIGTERM drains the node (readiness 503 while it drains, exit 0).
(Stops and kill -9 at every stage, mid-training included: tests/test_pipeline_resume_e2e.py.)
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.cdp import Browser
from tests.ops_tools import require_tool
from tests.orchestrator_helpers import (
    SMALL_DAEMONS, TINY_CONFIG, get_json, kill_group, start_node, tail, tiny_selfplay, wait_until, write_node_files,
)

pytestmark = pytest.mark.slow

PROMOTIONS = 2
CONFIG = {**{k: v for k, v in TINY_CONFIG.items() if k != "promotion"},  # the default gates: none
          "selfplay": {**TINY_CONFIG["selfplay"], "workers": 1},  # in its worker process, as by default
          "train": {**TINY_CONFIG["train"], "max_steps": 30}, "export": {"window_games": 300, "window_base_games": 0}}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(16),
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5}},
}}


@pytest.mark.timeout(600)
async def test_a_default_node_charts_elo_and_solved_accuracy_after_two_promotions_then_drains(tmp_path) -> None:
    require_tool("chromium")
    files = write_node_files(tmp_path / "solo", "solo", CONFIG, DAEMONS)
    proc = start_node(files)
    try:
        wait_until(lambda: files.health("/readyz")[0] == 200, 60, what="ready")
        assert files.health("/livez")[0] == 200
        wait_until(lambda: files.state().get("promoted", 0) >= PROMOTIONS, 480, interval=1.0,
                   what=f"{PROMOTIONS} promotions")
        assert files.state()["best_path"].startswith("models/")  # distributed, relative to the data dir
        status, body = files.health("/metrics")
        promotions = re.search(rb'^mesh_promotions_total\{node="solo"\} ([0-9.]+)$', body, re.MULTILINE)
        assert status == 200 and b"mesh_selfplay_games_total" in body and promotions
        assert float(promotions[1]) >= PROMOTIONS
        daemons = {d["name"]: d for d in json.loads(files.health("/daemons")[1])["daemons"]}
        assert set(daemons) >= {"selfplay", "export", "train", "gauntlet", "promote", "distribution"}

        def progress_complete() -> dict | None:
            p = get_json(files.mesh_port, "/progress") or {}
            gens = [g for g in p.get("generations", []) if g["promoted"]][:PROMOTIONS]
            return p if len(gens) == PROMOTIONS and all(g["elo"] is not None and g["accuracy"] for g in gens) else None

        progress = wait_until(progress_complete, 90, interval=1.0, what="every promoted generation rated and scored")
        # retention (pipeline/retention.py): generation 1's run, decided and no longer the best's,
        # loses its checkpoint and keeps its candidate (the registry's file) and result
        run1 = files.data_dir / "runs" / "gen_0001"
        wait_until(lambda: not (run1 / "checkpoint.pt").exists(), 60, what="generation 1's checkpoint removed")
        assert (run1 / "candidate.safetensors").is_file() and (run1 / "result.json").is_file()
        freed = re.search(rb'^mesh_retention_freed_bytes_total\{kind="checkpoints",node="solo"\} ([0-9.e+]+)$',
                          files.health("/metrics")[1], re.MULTILINE)
        assert freed and float(freed[1]) > 0
        first = progress["generations"][0]
        # rated against the fixed anchor every generation plays (gauntlet.anchor: the heuristic,
        # pinned at 0), not against generation 1: generation 1 has an Elo of its own
        assert first["generation"] == 1 and first["elo"] is not None and first["elo"] != 0.0
        assert (progress["anchor"] or "").startswith("heuristic"), progress["anchor"]
        assert all(g["elo_anchor"] == progress["anchor"] for g in progress["generations"][:PROMOTIONS])
        assert all(0.0 <= g["accuracy"]["exact"] <= g["accuracy"]["outcome"] <= 1.0
                   for g in progress["generations"][:PROMOTIONS])
        async with Browser(width=1280, height=1500) as browser:
            await browser.open(f"http://127.0.0.1:{files.health_port}/")
            # the page draws what the node reports: an Elo point per rated generation and an
            # accuracy row per scored promoted model (two, unless a third came in between)
            counts = await browser.wait_for("""(async () => {
                const d = await (await fetch('dashboard.json', {cache: 'no-store'})).json();
                const rated = d.generations.filter(g => g.elo !== null).length;
                const scored = d.generations.filter(g => g.promoted && g.accuracy).length;
                const points = document.querySelectorAll('#chart-elo svg circle.point').length;
                const rows = document.querySelectorAll('#accuracy tbody tr td[data-label="exact move"]').length;
                return points === rated && rows === scored && rows >= 2 ? [points, rows] : null; })()""",
                                            90, "the Elo chart and the accuracy panel")
            assert counts[0] >= PROMOTIONS and counts[1] >= PROMOTIONS, counts
            assert await browser.eval("document.getElementById('state').textContent") == "healthy"
            assert await browser.eval("document.querySelector('#nodes .readiness').textContent") == "ready"
            await browser.open(f"http://127.0.0.1:{files.health_port}/", width=390, height=844, mobile=True)
            await browser.wait_for("document.querySelectorAll('#accuracy tbody tr').length", 60, "the phone layout")
            assert await browser.eval("""[...document.querySelectorAll('table')].every(t =>
                t.getBoundingClientRect().width <= t.parentElement.clientWidth + 1)""")

        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        saw_503 = False
        while proc.poll() is None and time.monotonic() - sent < 90:  # a deadline for a hung drain, not a timing aim
            saw_503 = saw_503 or files.health("/readyz")[0] == 503
            time.sleep(0.05)
        assert proc.poll() == 0, tail(files)
        assert saw_503, "readiness should answer 503 while draining"
    except AssertionError:
        print(tail(files, 6000))
        raise
    finally:
        kill_group(proc)
