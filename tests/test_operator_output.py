"""What an operator reads: the terminal's progress line, and logs that are JSON lines when
stderr is a pipe (collectors) and human text on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

from app.coordination.pipeline.progress_display import describe, summarize_evaluation
from app.coordination.pipeline.state import PipelineState, Stage

ROOT = Path(__file__).resolve().parents[1]
LOG_ONE_LINE = ("from app.log import configure_logging, get_logger, bind_term; configure_logging('n7'); "
                "bind_term(4); get_logger('t').info('hello', games=12)")


def test_progress_line_names_generation_stage_games_loss_and_last_gauntlet() -> None:
    state = PipelineState(generation=3, stage=Stage.TRAINING, export_mark=100, best_sha256="ab" * 32,
                          best_generation=2, promoted=2, rejected=0)
    gauntlet = summarize_evaluation({"results": [{"kind": "random", "wins": 9, "draws": 0, "losses": 1}]})
    line = describe(state, 160, 0.8123, gauntlet)
    for part in ("generation 3: training", "games 160 (+60 new)", "best gen 2 (abababab", "promoted 2",
                 "loss 0.812", "last gauntlet random 9-0-1"):
        assert part in line, (part, line)
    assert "untrained" in describe(PipelineState(), 0, None, "") and "loss" not in describe(PipelineState(), 0, None, "")


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
