"""What an operator reads: the progress event, and logs that are JSON lines when stderr is a
pipe (collectors) and human text on a terminal: a node's whole output is one format."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from app.coordination.pipeline.progress_display import describe, summarize_evaluation
from app.coordination.pipeline.state import PipelineState, Stage

ROOT = Path(__file__).resolve().parents[1]
LOG_ONE_LINE = ("from app.log import configure_logging, get_logger, bind_term; configure_logging('n7'); "
                "bind_term(4); get_logger('t').info('hello', games=12)")


def test_progress_names_generation_stage_games_loss_and_last_gauntlet() -> None:
    state = PipelineState(generation=3, stage=Stage.TRAINING, export_mark=100, best_sha256="ab" * 32,
                          best_generation=2, promoted=2, rejected=0)
    gauntlet = summarize_evaluation({"results": [{"kind": "random", "wins": 9, "draws": 0, "losses": 1}]})
    assert describe(state, 160, 0.8123, gauntlet) == {
        "generation": 3, "stage": "training", "games": 160, "new_games": 60, "best_generation": 2,
        "best_sha256": "abababababab", "promoted": 2, "rejected": 0, "loss": 0.8123,
        "last_gauntlet": "random 9-0-1"}
    untrained = describe(PipelineState(), 0, None, "")
    assert untrained["best_generation"] is None and "loss" not in untrained and "last_gauntlet" not in untrained


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_nodes_whole_output_is_json_lines_on_a_pipe(tmp_path) -> None:
    """stdout and stderr of a running node, piped together as `make run > log 2>&1` does: every
    line is a JSON event (the progress event among them), and self-play's per-batch summary
    stays out of the default level."""
    from tests.orchestrator_helpers import TINY_CONFIG, kill_group, start_node, tail, wait_until, write_node_files

    daemons = {"restart": {"base_s": 0.5, "cap_s": 5}, "daemons": {
        "selfplay": {"critical": True, "settings": {"batch_games": 4, "simulations": 2, "rest_s": 0.2}}}}
    files = write_node_files(tmp_path / "solo", "solo", TINY_CONFIG, daemons)
    proc = start_node(files)
    try:
        def events() -> list[dict]:
            return [json.loads(line) for line in tail(files, 10**7).splitlines() if line.strip()]

        wait_until(lambda: sum(e["event"] == "progress" for e in events()) >= 2, 120, what="two progress events")
        progress = next(e for e in events() if e["event"] == "progress")
        assert progress["node_id"] == "solo" and progress["level"] == "info" and progress["games"] >= 0
        assert "stage" in progress and "generation" in progress
        assert not any(e["event"] == "selfplay_done" for e in events())
    except (AssertionError, ValueError):
        print(tail(files))
        raise
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=40)
        finally:
            kill_group(proc)
    assert all(isinstance(e, dict) for e in events())  # the drain's lines too


def test_logs_are_json_lines_on_a_pipe_with_node_and_term() -> None:
    proc = subprocess.run([sys.executable, "-c", LOG_ONE_LINE], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    event = json.loads(proc.stderr.strip().splitlines()[-1])
    assert event["event"] == "hello" and event["games"] == 12 and event["node_id"] == "n7" and event["term"] == 4


def test_logs_are_text_on_a_terminal() -> None:
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run([sys.executable, "-c", LOG_ONE_LINE], cwd=ROOT, stderr=terminal,
                              stdout=subprocess.DEVNULL, timeout=60)
        assert proc.returncode == 0
        text = os.read(controller, 65536).decode(errors="replace")
    finally:
        os.close(controller)
        os.close(terminal)
    assert "hello" in text and "games" in text
    assert not text.lstrip().startswith("{")  # the console renderer, not JSON
