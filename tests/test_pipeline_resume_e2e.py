"""Stop and start again at every pipeline stage: one real node is parked at each stage in turn
(collecting, exported, training, trained, evaluated) by the env-gated fault point of
`PipelineContext._test_hold` (training: mid-run, ranks alive, when the test sees them first,
else parked after the run), then killed with kill -9 and started; at the stages where a drain
has work of its own to finish (self-play's batch while collecting, the torchrun ranks while
training) it is first stopped with SIGTERM, started and parked there again. It resumes where it
was each time: the generation finishes once, with no game lost or counted twice, no generation
skipped, trained twice or decided twice (README: "stopping and starting again resumes where it
was"). A SIGTERM at the other stages only saves the state file a kill -9 already leaves there,
so it is not repeated at each (eight node starts, not eleven)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from app.coordination.pipeline.context import TEST_HOLD_ENV
from app.db.registry import ModelRegistry
from app.db.replay_db import ReplayDB
from app.games.train.dataset import dataset_sha256
from tests.orchestrator_helpers import (
    SMALL_DAEMONS,
    TINY_CONFIG,
    NodeFiles,
    group_alive,
    kill_group,
    start_node,
    tail,
    tiny_selfplay,
    wait_until,
    write_node_files,
)
from tests.train_fixtures import live_pids_with_marker

pytestmark = pytest.mark.slow

STAGES = ["collecting", "exported", "training", "trained", "evaluated"]
DRAINED_AT = {"collecting", "training"}  # where SIGTERM's drain stops running work before the kill -9
# Seven stops and eight starts: the smallest generation that still goes through every stage,
# self-play inline (`selfplay.workers: 0`): a worker process per start would import torch and
# load the search kernel eight times for a few dozen tiny games (tests/test_selfplay.py tests
# the workers' own stops and orphan exits).
CONFIG = {**TINY_CONFIG, "selfplay": {**TINY_CONFIG["selfplay"], "workers": 0}}
# A held daemon leaves its hold as cancelled when the node drains (PipelineContext._test_hold),
# so each stop takes what the production drain takes, not a stop timeout.
DAEMONS = {**SMALL_DAEMONS, "daemons": {
    **SMALL_DAEMONS["daemons"],
    "selfplay": tiny_selfplay(8),
    "export": {"critical": True, "settings": {"min_new_games": 24, "poll_s": 0.5}},
}}


def uids(files: NodeFiles) -> list[str]:
    if not (files.data_dir / "games.db").exists():
        return []
    with ReplayDB(files.data_dir / "games.db", create=False, readonly=True) as db:
        return db.uids()


def on_disk(files: NodeFiles) -> tuple[str, int, int]:
    """(stage, generation, decided generations) as a restart finds them (no file yet: the start)."""
    state = files.state()
    return (state.get("stage", "collecting"), state.get("generation", 1),
            state.get("promoted", 0) + state.get("rejected", 0))


def parked(files: NodeFiles, stage: str) -> bool:
    """The node reached the hold: the stage is on disk and the transition out of it is waiting.
    Training is also stopped mid-run when the test sees its ranks first (the checkpoint case)."""
    if on_disk(files)[0] != stage:
        return False
    if stage == "training" and any("rank_entry" in cmdline(pid) for pid in
                                   live_pids_with_marker(str(files.data_dir / "runs" / "gen_0001"))):
        return True
    return (files.data_dir / f"test_hold_{stage}").exists()


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def stop(proc: subprocess.Popen, files: NodeFiles, how: signal.Signals) -> None:
    if how is signal.SIGTERM:
        proc.send_signal(signal.SIGTERM)  # the orchestrator drains its daemons and exits 0
        assert proc.wait(timeout=90) == 0, tail(files)
    else:
        os.kill(proc.pid, signal.SIGKILL)  # the orchestrator alone: its children must follow it
        proc.wait(timeout=30)
    wait_until(lambda: not group_alive(proc.pid), 90, what="no process left of the stopped node")


@pytest.mark.timeout(1200)  # eight node starts: minutes on two busy cores
def test_kill_9_at_every_stage_and_sigterm_mid_work_resume_where_the_node_was(tmp_path) -> None:
    files = write_node_files(tmp_path / "node", config=CONFIG, daemons=DAEMONS)
    seen: set[str] = set()
    proc = None
    try:
        for stage in STAGES:
            for how in (signal.SIGTERM, signal.SIGKILL) if stage in DRAINED_AT else (signal.SIGKILL,):
                proc = start_node(files, "--max-generations", "1", env={TEST_HOLD_ENV: stage})
                wait_until(lambda s=stage: parked(files, s), 240, what=f"the node parked at {stage} ({how.name})")
                before = uids(files)
                assert before and len(before) == len(set(before)), "games stored once each"
                assert set(before) >= seen, "games stored before an earlier stop were lost"
                seen = set(before)
                stop(proc, files, how)
                assert on_disk(files) == (stage, 1, 0)  # what the restart finds: where it was, generation 1
                (files.data_dir / f"test_hold_{stage}").unlink(missing_ok=True)  # absent: stopped mid-run
        proc = start_node(files, "--max-generations", "1")  # no hold: the generation finishes
        assert proc.wait(timeout=300) == 0, tail(files)
    except AssertionError:
        print(tail(files, 6000))
        raise
    finally:
        if proc is not None:
            kill_group(proc)

    # Generation 2 may have begun before the drain (self-play went on while the node was parked):
    # everything below is about generation 1, and nothing of a third exists.
    state = files.state()
    assert (state["generation"], state["promoted"], state["rejected"]) == (2, 1, 0), state
    assert {p.name for p in (files.data_dir / "runs").iterdir()} <= {"gen_0001", "gen_0002"}
    datasets = sorted((files.data_dir / "datasets").iterdir())
    assert datasets[0].name == "gen_0001" and {d.name for d in datasets} <= {"gen_0001", "gen_0002"}
    with ReplayDB(files.data_dir / "games.db") as db:
        after = db.uids()
        assert db.integrity_problems() == []
    assert seen <= set(after) and len(after) == len(set(after))
    with ModelRegistry(files.data_dir / "registry.db") as registry:
        models = registry.models()
        best = registry.current_best()
    assert [m.generation for m in models] == [1]  # one candidate: generation 1 trained once, no other yet
    assert best is not None and best.sha256 == state["best_sha256"] == models[0].sha256
    assert models[0].parent_sha256 is None and models[0].dataset_sha256 == dataset_sha256(datasets[0])
    assert (files.data_dir / "models" / f"{state['best_sha256']}.safetensors").exists()
    # Decided once: the history never counts a second decision, and goes through the stages in order.
    history = [json.loads(line) for line in (files.data_dir / "pipeline_history.jsonl").read_text().splitlines()]
    assert max(h["promoted"] + h["rejected"] for h in history) == 1
    gen1 = [h["stage"] for h in history if h["generation"] == 1]
    assert [s for i, s in enumerate(gen1) if i == 0 or s != gen1[i - 1]] == STAGES[1:], gen1
    assert [h["stage"] for h in history if h["generation"] == 2][:1] == ["collecting"]
    assert all(h["generation"] <= 2 for h in history)
