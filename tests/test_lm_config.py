"""Choosing the workload in the node config: `workload: connect4 | lm` with its `lm:` section.
An unknown value, or a setting of the other workload, is an error naming the file and the key
(app/config/lm.py states the rule); configs/lm_copy.yaml loads and builds the real objects."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from app.config import ConfigError, Settings, load_settings
from app.config.lm import CONNECT4_SECTIONS, SHARED_TRAIN_KEYS
from app.lm.causal_lm import count_parameters
from app.lm.tasks import DigitTask
from app.lm.rollout.engine_config import build_engine
from app.lm.setup import (
    build_task, build_tokenizer, greedy_settings, heldout_prompts, initial_model, rollout_settings,
    train_prompts,
)
from tests.orchestrator_helpers import ROOT

pytestmark = pytest.mark.timeout(120)
EXAMPLE = ROOT / "configs" / "lm_copy.yaml"


def load(tmp_path: Path, data: dict) -> Settings:
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_settings(path)


def refused(tmp_path: Path, data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, data)
    message = str(info.value)
    assert message.startswith(f"{tmp_path / 'node.yaml'}: "), message
    return message


def test_the_example_loads_and_builds_the_models_task_and_engine_it_names() -> None:
    settings = load_settings(EXAMPLE)
    lm = settings.lm
    assert settings.workload == "lm" and settings.train.nproc == 1
    tok = build_tokenizer(lm.tokenizer)
    model = initial_model(lm.model, tok)
    assert 60_000 <= count_parameters(model) <= 90_000  # "about 75k", sized for 2 CPU cores
    task = build_task(lm.task)
    assert task == DigitTask(kind="copy", min_digits=3, max_digits=3, reward_kind="exact")
    train, held = train_prompts(task, lm.task), heldout_prompts(task, lm.task)
    assert len(train) == lm.task.train_prompts and len(held) == lm.task.heldout_prompts
    assert not {p.text for p in train} & {p.text for p in held}
    rollout = rollout_settings(lm.rollout)
    assert rollout.model_dump() == {**lm.rollout.model_dump(
        exclude={"batch_groups", "max_staleness", "oversample", "zero_variance",  # the manager's (lm_steps.py)
                 "publish_every"})}  # the trainer's publisher's (mesh_rollouts.py)
    assert greedy_settings(lm).temperature == 0.0 and greedy_settings(lm).n == 1
    engine = build_engine(lm.engines[0], model, tok)
    assert engine.name == "local" and engine.weight_version == 0
    assert lm.grpo.mode == "sft+rl" and lm.eval.method == "sign" and lm.eval.confidence == 0.95


def test_connect4_stays_the_default_and_its_configs_still_load(tmp_path: Path) -> None:
    assert Settings().workload == "connect4"
    bench = load_settings(ROOT / "configs" / "bench_loop.yaml")
    assert bench.workload == "connect4" and bench.search.simulations == 48
    assert load(tmp_path, {"workload": "connect4", "search": {"simulations": 8}}).search.simulations == 8


def test_an_unknown_workload_names_file_and_key(tmp_path: Path) -> None:
    message = refused(tmp_path, {"workload": "chess"})
    assert "workload: Input should be 'connect4' or 'lm'" in message


def test_an_lm_section_on_a_connect4_node_is_an_error(tmp_path: Path) -> None:
    assert "lm: an lm section on a connect4 node" in refused(tmp_path, {"lm": {"task": {"name": "copy"}}})
    assert "lm: an lm section" in refused(tmp_path, {"workload": "connect4", "lm": {}})


@pytest.mark.parametrize("section", CONNECT4_SECTIONS)
def test_a_connect4_section_on_an_lm_node_is_an_error_even_at_its_defaults(tmp_path: Path, section: str) -> None:
    message = refused(tmp_path, {"workload": "lm", section: {}})
    assert f"{section}: a connect4 setting on an lm node" in message


def test_connect4_keys_of_shared_sections_are_errors_on_an_lm_node_and_shared_keys_are_not(tmp_path: Path) -> None:
    message = refused(tmp_path, {"workload": "lm", "node": {"node_id": "a", "game": "connect4"},
                                 "train": {"nproc": 1, "lr": 0.1, "epochs": 2}})
    assert "node.game: a connect4 setting" in message
    assert "train.epochs: read only by the connect4 trainer" in message and "train.lr:" in message
    assert "train.nproc" not in message
    shared = {k: v for k, v in Settings().train.model_dump().items() if k in SHARED_TRAIN_KEYS}
    ok = load(tmp_path, {"workload": "lm", "node": {"node_id": "a"}, "train": shared, "mesh": {"profile": "fast"}})
    assert ok.workload == "lm" and ok.node.node_id == "a"


BAD_LM = [
    ({"rollout": {"temprature": 1.0}}, "lm.rollout.temprature: Extra inputs are not permitted"),
    ({"task": {"name": "sort"}}, "lm.task.name: Input should be 'copy', 'reverse', 'calc' or 'jsonl'"),
    ({"task": {"name": "jsonl", "path": "p.jsonl"}}, "task jsonl needs path (the prompt file) and reward"),
    ({"task": {"name": "copy", "reward": "math"}}, "reward: not read by task copy"),
    ({"task": {"name": "jsonl", "path": "p.jsonl", "reward": "math", "max_digits": 4}}, "max_digits: not read by task jsonl"),
    ({"task": {"name": "jsonl", "path": "p.jsonl", "reward": []}}, "reward: an empty list of terms"),
    ({"model": {"path": "some/dir", "hidden_size": 64}}, "hidden_size shape a random-init model and would not act"),
    ({"model": {"dtype": "float16"}}, "lm.model.dtype: Input should be 'float32' or 'bfloat16'"),
    ({"lora": {"r": 0}}, "lm.lora.r: Input should be greater than or equal to 1"),
    ({"lora": {"r": 4}}, "lm.lora on a randomly initialised model (no lm.model.path) cannot learn: LoRA freezes "
                         "the embeddings and norms"),
    ({"grpo": {"mode": "dpo"}}, "lm.grpo.mode: Input should be 'rl' or 'sft+rl'"),
    ({"grpo": {"rollouts": "stored", "eval_every": 5}}, "eval_every is read with rollouts: online only"),
    ({"grpo": {"rollouts": "stored", "tis_cap": 3.0}}, "tis_cap is read with rollouts: online only"),
    ({"grpo": {"tis_cap": -1}}, "lm.grpo.tis_cap: Input should be greater than or equal to 0"),
    ({"engines": [{"name": "s", "kind": "sglang"}]}, "a sglang engine needs a url"),
    ({"engines": [{"name": "l", "url": "http://127.0.0.1:1"}]}, "an in_process engine takes no url"),
    ({"engines": [{"name": "a"}, {"name": "a", "kind": "vllm", "url": "http://x"}]}, "engine names must be distinct"),
    ({"engines": []}, "lm.engines: List should have at least 1 item"),
    ({"tokenizer": {"kind": "file"}}, "path is required with kind: file"),
    ({"model": {"hidden_size": 30, "heads": 4}}, "must divide by heads"),
    ({"task": {"min_digits": 5, "max_digits": 3}}, "min_digits 5 is above max_digits 3"),
    ({"rollout": {"n": 1}}, "lm.rollout.n: Input should be greater than or equal to 2"),
    ({"rollout": {"max_new_tokens": 64, "max_seq_len": 32}}, "leaves no room for a prompt"),
    ({"eval": {"confidence": 1.0}}, "lm.eval.confidence: Input should be less than 1"),
]


@pytest.mark.parametrize(("lm", "why"), BAD_LM, ids=[w[:40] for _, w in BAD_LM])
def test_bad_lm_settings_name_file_and_key(tmp_path: Path, lm: dict, why: str) -> None:
    assert why in refused(tmp_path, {"workload": "lm", "lm": lm})


def test_a_node_started_with_a_connect4_setting_on_an_lm_config_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "node.yaml"
    data_dir = tmp_path / "data"
    config = yaml.safe_load(EXAMPLE.read_text())
    config.update({"node": {"node_id": "a", "data_dir": str(data_dir)}, "search": {"simulations": 8}})
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "app.p2p_orchestrator", "--config", str(path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=110, check=False)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {path}: search: a connect4 setting on an lm node" in proc.stderr, proc.stderr
    assert not data_dir.exists()  # refused before anything was written


def test_an_engines_timeouts_and_sync_mode_reach_the_engine_it_builds() -> None:
    """lm.engines[*].sync_timeout_s is the bound weight_sync puts on that engine's load (once
    dropped on the way, capping every load at the client's 120 s default)."""
    from app.config.lm import LMEngineSettings
    from app.lm.rollout.engine_config import build_engine

    sg = build_engine(LMEngineSettings(name="sg", kind="sglang", url="http://127.0.0.1:1", sync_timeout_s=7.5,
                                       request_timeout_s=3.0, sync="tensor", tp_size=2))
    vl = build_engine(LMEngineSettings(name="vl", kind="vllm", url="http://127.0.0.1:2", sync_timeout_s=900.0))
    assert (sg.sync_timeout_s, sg.request_timeout_s, sg.sync_mode, sg.tp_size) == (7.5, 3.0, "tensor", 2)
    assert (vl.sync_timeout_s, vl.request_timeout_s, vl.sync_mode) == (900.0, 120.0, "disk")
    assert not sg.in_service and not vl.in_service  # a server's weights are unknown until this node loads some
