"""Ticket-parallel rollout (scripts/rollout.py) under real torchrun: B=10 tickets on 3 ranks run
each ticket exactly once, rank 0 alone writes, a hung rank fails the run at the group timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.shared.process_group import rank_share
from app.lm.rollout.tickets import HANG_ENV, read_rollouts

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "rollout.py")
SMALL = ["--group-size", "2", "--max-new-tokens", "3", "--digits", "3"]


def run_script(*args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], check=False, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, cwd=ROOT)


@given(st.integers(0, 200), st.integers(1, 9))
def test_rank_shares_cover_every_item_once(total, world):
    seen = []
    for rank in range(world):
        offset, count = rank_share(total, rank, world)
        assert count == total // world + (rank < total % world)
        seen += range(offset, offset + count)
    assert seen == list(range(total))


@pytest.mark.timeout(300)
def test_ten_tickets_on_three_ranks_each_run_exactly_once(tmp_path):
    out = tmp_path / "roll"
    proc = run_script("--out", str(out), "--nproc", "3", "--prompts", "20", "--batch-size", "10", "--batches", "2",
                      *SMALL, "--timeout-s", "200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(proc.stdout.strip().splitlines()[-1])
    assert manifest["world_size"] == 3 and manifest["batches"] == ["batch_000000.jsonl", "batch_000001.jsonl"]
    rows = read_rollouts(out)
    per_batch = [json.loads(line) for line in (out / "batch_000000.jsonl").read_text().splitlines()]
    assert Counter(r["rank"] for r in per_batch) == {0: 4, 1: 3, 2: 3}  # B//W + (r < B%W)
    tickets = [r["ticket"] for r in rows]
    assert sorted(tickets) == list(range(20))  # 2 batches of 10 = one epoch: every prompt exactly once
    for row in rows:
        group = row["group"]
        assert len(group["samples"]) == 2 and {s["prompt_id"] for s in group["samples"]} == {group["prompt_id"]}
    logs = sorted(p.name for p in (out / "logs").glob("rank_*.log"))
    assert logs == ["rank_0.log", "rank_1.log", "rank_2.log"]
    assert sorted(p.name for p in out.glob("*.jsonl")) == manifest["batches"]  # nothing but rank 0's files


@pytest.mark.timeout(200)
def test_one_process_by_default(tmp_path):
    out = tmp_path / "roll1"
    proc = run_script("--out", str(out), "--prompts", "8", "--batch-size", "5", "--batches", "2", *SMALL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_rollouts(out)
    assert json.loads((out / "manifest.json").read_text())["world_size"] == 1
    assert [r["rank"] for r in rows] == [0] * 10
    # epoch 0 is a permutation of the 8 prompts, then epoch 1 begins: 8 distinct, then 2 more
    assert sorted(r["ticket"] for r in rows[:8]) == list(range(8))


@pytest.mark.timeout(200)
def test_a_hung_rank_fails_the_run_at_the_group_timeout(tmp_path):
    out = tmp_path / "hang"
    proc = run_script("--out", str(out), "--nproc", "2", "--prompts", "8", "--batch-size", "4", "--batches", "3",
                      *SMALL, "--pg-timeout", "6", "--timeout-s", "150", env={HANG_ENV: "1"})
    assert proc.returncode == 1
    assert "rollout failed" in proc.stderr and "rank 0" in proc.stderr
    assert not (out / "manifest.json").exists()
