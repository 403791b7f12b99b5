"""What a user gets wrong first, refused by the real node in one line naming the file or key
(issue 43): a hub name where a directory belongs, a directory that is not there, a prompt-file
line that is not JSON (its line number), a record without the field the reward reads, and a
reward path that does not import. Each is `python -m app.p2p_orchestrator --config ...`,
all five at once, checked before any daemon starts (app/lm/setup.py check_inputs).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.lm.demo_model import arithmetic_records, make_demo, write_jsonl
from tests.mesh_helpers import free_ports
from tests.orchestrator_helpers import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # five real nodes start and stop


def node_config(model: str | Path, prompts: Path, reward: str = "math") -> dict:
    return {"workload": "lm", "lm": {"model": {"path": str(model)},
                                     "task": {"name": "jsonl", "path": str(prompts), "reward": reward}}}


def start(root: Path, config: dict) -> subprocess.Popen:
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(yaml.safe_dump(config))
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
    procs = {name: start(tmp_path / name, config) for name, (config, _) in cases.items()}
    try:
        outputs = {name: proc.communicate(timeout=240)[0] for name, proc in procs.items()}
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for name, (_, says) in cases.items():
        out = outputs[name]
        assert procs[name].returncode != 0, (name, out)
        assert "Traceback" not in out, (name, out)
        errors = [line for line in out.splitlines() if line.lower().startswith("error:")]
        assert len(errors) == 1, (name, out)
        for part in says:
            assert part in errors[0], (name, part, errors[0])
        assert not (tmp_path / name / "data" / "rollouts.db").exists(), name  # stopped before any daemon
