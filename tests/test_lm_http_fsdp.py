"""HTTP engines beside FSDP training (issue 53, item 7): two FSDP2 ranks under real torchrun
and ONE SGLang / vLLM server (the loopback stubs of the real routes, tests/engine_stubs.py).
Rank 0 gathers the whole weights and loads them into the server after every step, once per
version; the server confirms each load before either rank generates with it; both ranks'
rollouts are answered by the version just loaded, and step k trains on version k - 1. The
sharing is the engine kind's business nowhere (rollout_sources.GeneratedGroups): SGLang's
stub stands for both (vLLM's load path at one rank: test_lm_online_sync.py); one torchrun
run keeps the suite short."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from app.shared.launcher import LaunchSpec, launch
from tests import lm_http_fsdp_job as job
from tests.engine_stubs import SGLangStub

pytestmark = pytest.mark.timeout(300)
STEPS = 3
JOB = str(Path(job.__file__).resolve())


async def run_two_ranks(server, kind: str, run_dir: Path) -> None:
    await server.start()
    try:
        spec = LaunchSpec(target=[JOB, "--url", server.url, "--kind", kind, "--run-dir", str(run_dir),
                                  "--steps", str(STEPS)], nproc=2, log_dir=run_dir / "logs", timeout_s=240,
                          status_every_s=0)
        await asyncio.to_thread(launch, spec, out=io.StringIO())
    finally:
        await server.stop()


def rl_lines(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


async def test_two_fsdp_ranks_share_one_sglang_server(tmp_path):
    server = SGLangStub()
    await run_two_ranks(server, "sglang", tmp_path)
    loads = server.bodies("/update_weights_from_disk")
    # one load per version, by rank 0 alone: the start weights (0), then after every step
    assert [(b["model_path"], b["weight_version"]) for b in loads] == [
        (str(tmp_path / "engine_weights" / f"step_{v}"), str(v)) for v in range(STEPS + 1)]
    order = [p for p in server.paths() if p in ("/update_weights_from_disk", "/model_info", "/generate")]
    for i, path in enumerate(order):
        if path == "/update_weights_from_disk":
            assert order[i + 1] == "/model_info"  # confirmed before anything is generated
    version, asked = None, {}
    for _, path, _, body in server.calls:
        if path == "/update_weights_from_disk":
            version = body["weight_version"]
        elif path == "/generate":
            asked[version] = asked.get(version, 0) + len(body["input_ids"])
    # each version but the last serves one step: 4 prompts x 2 completions, from both ranks
    assert asked == {str(v): 8 for v in range(STEPS)}
    assert [m["weight_version"] for m in rl_lines(tmp_path)] == list(range(STEPS))
    assert json.loads((tmp_path / "ranks.json").read_text())["versions"] == [float(STEPS)] * 2
