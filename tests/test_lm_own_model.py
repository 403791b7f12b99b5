"""A user's own checkpoint through the training entry's config path, under real torchrun
(issue 43): a tiny random-init GPT-2 (another architecture than the toy Llama and the demo
Qwen2: Conv1D projections, GPT2Block decoder layers) trains generation 1 (`mode: rl`: GRPO on
its own rollouts from the first generation) at one rank and at two FSDP2 ranks with the same
losses; and a LoRA run (generation 1 of `sft+rl`: SFT alone) changes only what its adapters
change, its merged candidate computing what base + adapter do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from peft import PeftModel
from safetensors.torch import load_file

from app.config import load_settings
from app.db.rollout_store import RolloutStore
from app.lm.causal_lm import load_model
from app.lm.demo_model import DemoShape, arithmetic_records, make_demo, write_jsonl
from app.lm.rollout.batches import rollout_batch
from app.lm.rollout.engine import InProcessEngine
from app.lm.rollout.rollout_dataset import export_rollouts
from app.lm.setup import build_task, build_tokenizer, initial_model, rollout_settings, train_prompts
from app.lm.train.candidate import ADAPTER_NAME
from app.lm.train.generation import CANDIDATE_NAME, RESULT_NAME
from tests.test_lm_train_entry import train

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]
torch.set_num_threads(1)


def digit_share(record: Mapping[str, Any], completion_text: str) -> float:
    """A graded reward, the share of the completion's characters that are digits, so a random
    model's groups have advantages that are not all zero."""
    text = completion_text.strip()
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


def write_config(tmp: Path, model: Path, prompts: Path, **lm_extra: Any) -> Path:
    data = yaml.safe_load((Path(__file__).resolve().parents[1] / "configs" / "lm_demo.yaml").read_text())
    lm = data["lm"]
    lm["model"]["path"] = str(model)
    lm["task"] = {"name": "jsonl", "path": str(prompts), "reward": "tests.test_lm_own_model:digit_share",
                  "train_prompts": 64, "heldout_prompts": 8}
    lm["rollout"].update(n=4, length_is_parse_failure=False)  # a random model rarely stops
    lm["grpo"].update(steps=4, groups_per_step=4, rollouts="stored")  # one dataset for 1 and 2 ranks: equal losses
    lm["grpo"]["sft"].update(steps=6, batch_size=8, lr=0.01)
    lm.update(lm_extra)
    path = tmp / "lm.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def make_dataset(config: Path, out: Path) -> Path:
    """16 groups sampled by the initial model, stored and exported as the pipeline does."""
    lm = load_settings(config).lm
    tok = build_tokenizer(lm.tokenizer)
    task = build_task(lm.task, tok)
    engine = InProcessEngine(initial_model(lm.model, tok), tok)
    with RolloutStore(out.parent / f"{out.name}.db") as store:
        rollout_batch(engine, task, tok, train_prompts(task, lm.task)[:16], rollout_settings(lm.rollout), store,
                      node_id="n1", model_id="init", seed=1)
        return export_rollouts(store, out, window_groups=64).path


def losses(run_dir: Path) -> list[tuple[str, int, float]]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(m["phase"], m["step"], m["loss"]) for m in lines if "step" in m]  # not the dropped-groups line


def test_a_gpt2_checkpoint_trains_alike_on_one_rank_and_two_fsdp2_ranks(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "gpt2", DemoShape(model_type="gpt2"))
    config_file = demo["model"] / "config.json"
    gpt2 = json.loads(config_file.read_text())
    assert gpt2["model_type"] == "gpt2"
    # GPT-2's dropout (0.1) draws other masks on other world sizes: without it, the same losses
    config_file.write_text(json.dumps({**gpt2, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}))
    prompts = write_jsonl(tmp_path / "arith.jsonl", arithmetic_records(max_a=19, max_b=9))
    config = write_config(tmp_path, demo["model"], prompts)
    data = yaml.safe_load(config.read_text())
    data["lm"]["grpo"]["mode"] = "rl"  # generation 1 of sft+rl is SFT alone: GRPO from the first generation
    config.write_text(yaml.safe_dump(data))
    dataset = make_dataset(config, tmp_path / "rollouts")
    runs = {}
    for nproc in (1, 2):
        run_dir = tmp_path / f"run{nproc}"
        proc = train(config, dataset, run_dir, 1, nproc=nproc)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert json.loads((run_dir / RESULT_NAME).read_text())["world_size"] == nproc
        runs[nproc] = losses(run_dir)
    one, two = runs[1], runs[2]
    assert [(p, s) for p, s, _ in one] == [(p, s) for p, s, _ in two] == [("rl", s) for s in range(1, 5)]
    assert any(loss != 0.0 for phase, _, loss in one if phase == "rl")  # GRPO had something to learn from
    for (phase, step, a), (_, _, b) in zip(one, two):
        assert abs(a - b) <= 1e-5, (phase, step, a, b)
    assert type(load_model(tmp_path / "run2" / CANDIDATE_NAME)).__name__ == "GPT2LMHeadModel"


def test_lora_changes_only_the_adapted_weights_and_the_merged_model_is_base_plus_adapter(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "demo")
    prompts = write_jsonl(tmp_path / "arith.jsonl", arithmetic_records(max_a=19, max_b=9))
    config = write_config(tmp_path, demo["model"], prompts,
                          lora={"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    run_dir = tmp_path / "run"
    proc = train(config, make_dataset(config, tmp_path / "rollouts"), run_dir, 1, nproc=1)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    base, merged = load_model(demo["model"]), load_model(run_dir / CANDIDATE_NAME)
    assert type(merged) is type(base)  # a plain model of the base architecture: what engines load
    before, after = base.state_dict(), merged.state_dict()
    assert before.keys() == after.keys()
    adapted = {k for k in before if k.endswith(("q_proj.weight", "v_proj.weight"))}
    assert len(adapted) == 2 * base.config.num_hidden_layers
    for key in before:
        if key in adapted:
            assert not torch.equal(before[key], after[key]), key  # the adapter trained
        else:
            assert torch.equal(before[key], after[key]), key  # everything else stayed frozen

    adapter = run_dir / ADAPTER_NAME
    assert set(load_file(str(adapter / "adapter_model.safetensors"))) and (adapter / "adapter_config.json").exists()
    with_adapter = PeftModel.from_pretrained(load_model(demo["model"]), str(adapter)).eval()
    ids = torch.randint(3, base.config.vocab_size, (4, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = with_adapter(input_ids=ids).logits
        got = merged(input_ids=ids).logits
        plain = base(input_ids=ids).logits
    assert not torch.allclose(plain, expected, atol=1e-4)  # the adapter matters ...
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)  # ... and merged = base + adapter
