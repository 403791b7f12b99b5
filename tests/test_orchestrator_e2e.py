"""The real orchestrator process on one node: a promoted generation, then a clean SIGTERM.
(Stops and kill -9 at every stage, mid-training included: tests/test_pipeline_resume_e2e.py.)"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from app.db.registry import ModelRegistry
from tests.orchestrator_helpers import (
    SMALL_DAEMONS, TINY_CONFIG, kill_group, start_node, tail, tiny_selfplay, wait_until, write_node_files,
)

pytestmark = pytest.mark.slow

# The smallest generation that goes through every stage: this test is about the process
# (ready, a generation promoted and distributed, metrics, a clean drain), not about strength.
# self-play in its worker process, as a node runs by default (TINY_CONFIG plays inline)
CONFIG = {**TINY_CONFIG, "selfplay": {**TINY_CONFIG["selfplay"], "workers": 1}}
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(16),
    "export": {"critical": True, "settings": {"min_new_games": 32, "poll_s": 0.5}},
}}


@pytest.mark.timeout(900)  # generous bounds: a generation on two busy cores
def test_one_generation_promoted_then_sigterm_drains(tmp_path) -> None:
    files = write_node_files(tmp_path / "node", config=CONFIG, daemons=DAEMONS)
    proc = start_node(files)
    try:
        wait_until(lambda: files.health("/readyz")[0] == 200, 60, what="ready")
        assert files.health("/livez")[0] == 200
        wait_until(lambda: files.state().get("promoted", 0) >= 1 and files.state().get("best_path", "")
                   .startswith("models/"), 700, what="a promoted, distributed generation")
        status, body = files.health("/metrics")
        promotions = re.search(rb'^mesh_promotions_total\{node="solo"\} ([0-9.]+)$', body, re.MULTILINE)
        assert status == 200 and b"mesh_selfplay_games_total" in body and promotions and float(promotions[1]) >= 1
        daemons = {d["name"]: d for d in json.loads(files.health("/daemons")[1])["daemons"]}
        assert set(daemons) >= {"selfplay", "export", "train", "gauntlet", "promote", "distribution"}

        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        saw_503 = False
        while proc.poll() is None and time.monotonic() - sent < 90:  # a deadline for a hung drain, not a timing aim
            saw_503 = saw_503 or files.health("/readyz")[0] == 503
            time.sleep(0.05)
        assert proc.poll() == 0, tail(files)
        assert saw_503, "readiness should answer 503 while draining"
    finally:
        kill_group(proc)
    with ModelRegistry(files.data_dir / "registry.db") as registry:
        best = registry.current_best()
    assert best is not None and best.generation >= 1
