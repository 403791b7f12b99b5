"""The torchrun launcher: argv building, failure attribution, and real torchrun runs on CPU."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from app.shared.launcher import (
    LaunchError, LaunchSpec, RankStatus, build_torchrun_argv, first_failure, launch, parse_torchrun_failures,
)
from tests.train_fixtures import kill_pids, live_pids_with_marker

ROOT = Path(__file__).resolve().parents[1]

FAILING_WORKER = """
import os, signal, sys, time
import torch, torch.distributed as dist
torch.set_num_threads(1)
dist.init_process_group("gloo")
rank = dist.get_rank()
print(" ".join(f"{k}={os.environ[k]}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")), flush=True)
t = torch.ones(1)
for _ in range(3):
    dist.all_reduce(t)
if rank == 0:
    # a rank that ignores SIGTERM: torchrun alone would wait 30 s before SIGKILL
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("rank 0 sleeping", flush=True)
dist.barrier()  # rank 1 fails only once rank 0 ignores SIGTERM (state, not a fixed wait)
while rank == 0:
    time.sleep(0.2)
raise RuntimeError("rank one gives up")
"""

OK_WORKER = """
import json, os, sys
with open(sys.argv[1], "w") as fh:
    json.dump({"argv": sys.argv[2:], "rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"]}, fh)
print("worker done", flush=True)
"""


def test_argv_single_node_uses_static_port_and_rank_entry():
    spec = LaunchSpec(target=["-m", "app.games.train.train", "--x", "1"], nproc=3, log_dir=Path("/tmp/l"))
    argv = build_torchrun_argv(spec, 29555)
    assert argv[1:3] == ["-m", "torch.distributed.run"]
    joined = " ".join(argv)
    assert "--nproc-per-node 3" in joined and "--master-port 29555" in joined and "--master-addr 127.0.0.1" in joined
    assert argv[-6:] == ["-m", "app.shared.rank_entry", "-m", "app.games.train.train", "--x", "1"]
    assert "--rdzv-endpoint" not in argv


def test_argv_multi_node_passes_rendezvous_through():
    spec = LaunchSpec(target=["job.py"], nproc=2, log_dir=Path("/tmp/l"), nnodes="2", node_rank=1,
                      rdzv_endpoint="10.0.0.5:29400", rdzv_id="gen7")
    argv = build_torchrun_argv(spec, None)
    joined = " ".join(argv)
    assert "--nnodes 2" in joined and "--node-rank 1" in joined
    assert "--rdzv-backend c10d --rdzv-endpoint 10.0.0.5:29400 --rdzv-id gen7" in joined
    assert "--master-port" not in argv


def test_parse_torchrun_summary():
    text = """
Failures:
[1]:
  time      : 2026-11-22_02:42:07
  host      : localhost
  rank      : 3 (local_rank: 1)
  exitcode  : -9 (pid: 5259)
Root Cause (first observed failure):
[0]:
  rank      : 2 (local_rank: 0)
  exitcode  : 1 (pid: 5258)
"""
    assert parse_torchrun_failures(text) == {3: -9, 2: 1}
    assert parse_torchrun_failures("all good") == {}


@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, -15, -9, None]), st.floats(0, 100)), min_size=1, max_size=6))
def test_first_failure_prefers_earliest_real_failure(ranks):
    statuses = [RankStatus(i, "exited", exit_code=code, ended_at=at) for i, (code, at) in enumerate(ranks)]
    chosen = first_failure(statuses)
    failed = [s for s in statuses if s.exit_code != 0]
    if not failed:
        assert chosen is None
        return
    assert chosen is not None and chosen.exit_code != 0
    real = [s for s in failed if s.exit_code not in (None, -15)]
    if real:
        assert chosen in real and chosen.ended_at == min(s.ended_at for s in real)
    else:
        assert chosen.exit_code in (None, -15)


@pytest.mark.timeout(90)
def test_failing_rank_fails_the_run_fast_names_rank_and_leaves_no_orphans(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(FAILING_WORKER)
    marker = f"launcher-test-{uuid.uuid4().hex}"
    out = io.StringIO()
    statuses: list[list[RankStatus]] = []
    spec = LaunchSpec(target=[str(script)], nproc=2, log_dir=tmp_path / "logs", grace_s=1.0,
                      env={"TEST_MARKER": marker}, status_every_s=1.0, timeout_s=60)
    try:
        with pytest.raises(LaunchError) as info:
            launch(spec, out=out, on_status=statuses.append)
        err = info.value
        assert err.rank == 1 and err.exit_code == 1
        assert "rank 1 failed first with exit code 1" in str(err)
        assert any("RuntimeError: rank one gives up" in line for line in err.last_lines)
        assert err.log_path == (tmp_path / "logs" / "rank_1.log").resolve()
        # fail fast: the launcher itself killed the rank that ignored SIGTERM once its grace
        # period after the first failure was over (torchrun alone waits 30 s); rank 1 recorded its exit
        assert json.loads((tmp_path / "logs" / "rank_1.exit.json").read_text())["at"] > 0
        # per-rank logs, [Rank r] prefixes, the torchrun environment, status lines
        log0 = (tmp_path / "logs" / "rank_0.log").read_text()
        assert "RANK=0 LOCAL_RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" in log0
        assert "RANK=1 LOCAL_RANK=1 WORLD_SIZE=2" in (tmp_path / "logs" / "rank_1.log").read_text()
        # a rank's log is JSON lines as every file the node writes: time, rank, stream, its text
        records = [json.loads(line) for line in (tmp_path / "logs" / "rank_1.log").read_text().splitlines()]
        assert all(r["source"] == "rank" and r["rank"] == 1 and r["timestamp"].endswith("Z") for r in records)
        assert any(r["stream"] == "stderr" and r["event"] == "RuntimeError: rank one gives up" for r in records)
        assert any(r["stream"] == "stdout" and r["event"].startswith("RANK=1 ") for r in records)
        text = out.getvalue()
        assert "[Rank 0] rank 0 sleeping" in text and "[Rank 1] RuntimeError: rank one gives up" in text
        assert "[launcher] ranks still running 1s after the first failure: killing them" in text
        assert "rank 0 running" in text  # the periodic status line
        assert any(any(s.state == "running" for s in snap) for snap in statuses)
        assert all(s.state == "exited" for s in statuses[-1])
        assert live_pids_with_marker(marker) == []
    finally:
        kill_pids(live_pids_with_marker(marker))


@pytest.mark.timeout(90)
def test_cli_passes_arguments_through_and_succeeds(tmp_path):
    script = tmp_path / "ok.py"
    script.write_text(OK_WORKER)
    result_file = tmp_path / "seen.json"
    proc = subprocess.run(
        [sys.executable, "-m", "app.shared.launcher", "--nproc", "1", "--log-dir", str(tmp_path / "logs"),
         "--log-format", "json", "--script", str(script), "--", str(result_file), "--flag", "value"],
        cwd=ROOT, capture_output=True, text=True, timeout=80,
    )
    assert proc.returncode == 0, proc.stderr + proc.stdout
    seen = json.loads(result_file.read_text())
    assert seen == {"argv": ["--flag", "value"], "rank": "0", "world": "1"}
    # --log-format json (a daemon's launcher.log): every line printed is a JSON line
    printed = [json.loads(line) for line in proc.stdout.splitlines()]
    assert all("timestamp" in r and r["source"] in ("launcher", "torchrun", "rank") for r in printed)
    assert {"source": "rank", "rank": 0, "stream": "stdout", "event": "worker done"}.items() <= next(
        r for r in printed if r["event"] == "worker done").items()
    assert printed[-1]["source"] == "launcher" and "finished" in printed[-1]["event"]
    assert "worker done" in (tmp_path / "logs" / "rank_0.log").read_text()
    assert all(json.loads(line)["source"] == "torchrun" for line in (tmp_path / "logs" / "torchrun.log").read_text().splitlines())
    assert json.loads((tmp_path / "logs" / "rank_0.exit.json").read_text())["exit_code"] == 0


def test_bad_nproc_is_a_clear_error(tmp_path):
    with pytest.raises(LaunchError, match="nproc"):
        launch(LaunchSpec(target=["x.py"], nproc=0, log_dir=tmp_path))


def test_nproc_auto_is_one_per_gpu_and_one_without_a_gpu() -> None:
    import argparse

    import torch

    from app.shared.launcher import build_parser, parse_nproc, resolve_nproc
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    assert resolve_nproc("auto") == resolve_nproc(0) == (gpus or 1)
    assert resolve_nproc(3) == 3
    assert build_parser().parse_args(["--log-dir", "x", "--", "t.py"]).nproc == "auto"
    with pytest.raises(argparse.ArgumentTypeError, match="count or auto"):
        parse_nproc("two")
    with pytest.raises(argparse.ArgumentTypeError, match="negative"):
        parse_nproc("-1")
