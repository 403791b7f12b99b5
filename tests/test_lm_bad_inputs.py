"""What a user gets wrong first, refused by the real node in one line naming the file or key
(issue 43): a hub name where a directory belongs, a directory that is not there, a prompt-file
line that is not JSON (its line number), a record without the field the reward reads, and a
reward path that does not import. Every one is found by `check_inputs` (app/lm/setup.py), which
the node runs before any daemon starts: the first case goes through the real node
(`python -m app.p2p_orchestrator --config ...`: one `error:` line, no traceback, a non-zero exit,
no daemon started), the other four through the same config file and `check_inputs` in this
process (a node start is ~10 CPU s of imports; the message is the exception's, printed as is).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import load_settings
from app.lm.demo_model import arithmetic_records, make_demo, write_jsonl
from app.lm.setup import LMInputError, check_inputs
from tests.mesh_helpers import free_ports
from tests.orchestrator_helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a real node starts and stops


def node_config(model: str | Path, prompts: Path, reward: str = "math") -> dict:
    return {"workload": "lm", "lm": {"model": {"path": str(model)},
                                     "task": {"name": "jsonl", "path": str(prompts), "reward": reward}}}


def write_config(root: Path, config: dict) -> Path:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
    return root / "config.yaml"


def start(root: Path, config: dict) -> subprocess.Popen:
    write_config(root, config)
    mesh, health = free_ports(2)
    return subprocess.Popen([sys.executable, "-m", "app.p2p_orchestrator", "--config", str(root / "config.yaml"),
                             "--data-dir", str(root / "data"), "--port", str(mesh), "--health-port", str(health)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def test_each_bad_input_stops_the_node_with_one_line_naming_it(tmp_path: Path) -> None:
    model = make_demo(tmp_path / "demo")["model"]
    records = arithmetic_records(max_a=9, max_b=9)
    good = write_jsonl(tmp_path / "good.jsonl", records)
    not_json = tmp_path / "not_json.jsonl"
    not_json.write_text("".join(json.dumps(r) + "\n" for r in records[:2]) + "{\"prompt\": \"1+1\", \"answer\": 2\n")
    no_answer = write_jsonl(tmp_path / "no_answer.jsonl", [records[0], {"prompt": "What is 1+1?", "completion": "2"}])
    missing = tmp_path / "nowhere" / "model"
    cases = {  # name -> (config, what the one line must say)
        "hub": (node_config("Qwen/Qwen2.5-0.5B", good), ["lm.model.path", "Qwen/Qwen2.5-0.5B", "hub name"]),
        "missing": (node_config(missing, good), ["lm.model.path", str(missing), "not a local directory"]),
        "not_json": (node_config(model, not_json), [f"{not_json}:3", "not JSON"]),
        "no_field": (node_config(model, no_answer), [f"{no_answer}:2", "'answer'", "math"]),
        "no_import": (node_config(model, good, "no_such_package.rewards:score"),
                      ["lm.task.reward", "no_such_package.rewards:score", "cannot import"]),
    }
    first, *others = cases
    proc = start(tmp_path / first, cases[first][0])
    try:
        out = proc.communicate(timeout=240)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0, out
    assert "Traceback" not in out, out
    errors = [line.removeprefix("error: ") for line in out.splitlines() if line.lower().startswith("error:")]
    assert len(errors) == 1, out
    assert not (tmp_path / first / "data" / "rollouts.db").exists()  # stopped before any daemon
    for name in others:
        with pytest.raises(LMInputError) as refused:
            check_inputs(load_settings(write_config(tmp_path / name, cases[name][0])).lm)
        errors.append(str(refused.value))
        assert "\n" not in errors[-1], (name, errors[-1])
    for (name, (_, says)), error in zip(cases.items(), errors):
        for part in says:
            assert part in error, (name, part, error)
