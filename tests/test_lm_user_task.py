"""Issue 43's user path end to end: a team's own checkpoint directory, prompt file and reward.

The checkpoint is the demo's byte-level BPE tokenizer and small Qwen2, built offline with
`save_pretrained` (app/lm/demo_model.py) and loaded by path as a downloaded one would be. The
prompt file is a JSONL of chat records written here ("Copy 4821" -> "4821"), and the reward is
`copied` below, named by import path (`tests.test_lm_user_task:copied`): the node, its torchrun
trainer and its gate import it as they would a user's package. One real node runs
`python -m app.p2p_orchestrator --config ...`: generation 1 is SFT on the records'
completions, later generations GRPO; the test passes when a GRPO generation is promoted over
the SFT model, i.e. its held-out reward is higher with the paired sign test at 95%.

The demonstrations are imperfect on purpose, as a team's often are: 60% of the records'
completions drop the last digit, so SFT (200 steps at lr 3e-3) learns to copy but, greedily,
mostly stops one digit short (held-out exact ~0.25), while sampling still copies whole now and
then. The reward knows the right answer, so GRPO moves the model to it (in process, 10 GRPO
steps took seed 0 from 0.25 to 0.92): a rise the sign test sees in one generation.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.lm.demo_model import make_demo, write_jsonl
from tests.orchestrator_helpers import ROOT, get_json, kill_group, start_node, tail, wait_until, write_node_files

pytestmark = pytest.mark.slow


def copied(record: Mapping[str, Any], completion_text: str) -> float:
    """The user's reward: 1 when the completion is the record's digits, else 0."""
    return float(completion_text.strip() == record["digits"])


def copy_records(n: int = 1500, seed: int = 0, short: float = 0.6) -> list[dict]:
    """Chat records "Copy 4821"; the demonstration drops the last digit with probability `short`."""
    rng, seen = random.Random(seed), set()
    while len(seen) < n:
        seen.add(str(rng.randint(100, 9999)))
    return [{"messages": [{"role": "user", "content": f"Copy {s}"}], "digits": s,
             "completion": s[:-1] if rng.random() < short else s} for s in sorted(seen)]


def user_config(demo: Path, prompts: Path) -> dict:
    """configs/lm_demo.yaml with the user's prompt file and reward, and shorter generations."""
    cfg = yaml.safe_load((ROOT / "configs" / "lm_demo.yaml").read_text())
    lm = cfg["lm"]
    lm["model"]["path"] = str(demo / "model")
    lm["task"] = {"name": "jsonl", "path": str(prompts), "reward": "tests.test_lm_user_task:copied",
                  "train_prompts": 1024, "heldout_prompts": 200}
    lm["rollout"].update(max_new_tokens=8, batch_groups=32)
    lm["eval"].update(max_new_tokens=8)
    lm["grpo"].update(steps=16)  # 8 groups a step: each new group twice
    lm["grpo"]["sft"].update(steps=200)
    lm["export"] = {"min_new_groups": 64, "window_groups": 64}
    return cfg


DAEMONS = {
    "restart": {"base_s": 0.5, "cap_s": 5},
    "daemons": {
        "dlq_retry": {},
        "selfplay": {"critical": True, "stop_timeout_s": 15},
        "export": {"critical": True, "settings": {"poll_s": 0.5}},
        "train": {"depends_on": ["export"], "critical": True, "stop_timeout_s": 15, "settings": {"poll_s": 0.5}},
        "gauntlet": {"depends_on": ["train"], "critical": True, "settings": {"poll_s": 0.5}},
        "promote": {"depends_on": ["gauntlet"], "critical": True, "settings": {"poll_s": 0.5}},
    },
}


def _progress(port: int) -> tuple[list[dict], dict[int, dict]]:
    """(models of the registry, held-out row by generation) from a lone node's /progress."""
    progress = get_json(port, "/progress") or {}
    return progress.get("models", []), {row["generation"]: row for row in progress.get("heldout", [])}


@pytest.mark.timeout(900)  # a deadline on state below; two busy cores
def test_own_checkpoint_prompt_file_and_reward_sft_then_grpo_beats_sft(tmp_path: Path) -> None:
    demo = make_demo(tmp_path / "demo")["model"].parent
    prompts = write_jsonl(tmp_path / "copy.jsonl", copy_records())
    files = write_node_files(tmp_path / "node", "user", user_config(demo, prompts), DAEMONS)
    proc = start_node(files)
    try:
        def grpo_promoted() -> tuple[dict, dict[int, dict]] | None:
            models, heldout = _progress(files.mesh_port)
            best = next((m for m in models if m["generation"] >= 2 and m["promoted_at"] is not None), None)
            return (best, heldout) if best is not None and best["generation"] in heldout else None

        promoted, heldout = wait_until(grpo_promoted, 600, interval=1.0, what="a GRPO generation promoted over SFT")
        sft = heldout[1]
        assert sft["reward"] > heldout[0]["reward"], heldout  # SFT first beat the random init ...
        assert heldout[promoted["generation"]]["reward"] > sft["reward"], heldout  # ... then GRPO beat SFT
        runs = [json.loads(p.read_text()) for p in sorted((files.data_dir / "runs").glob("gen_*/result.json"))]
        by_generation = {r["generation"]: r for r in runs}
        assert by_generation[1]["sft_steps"] == 200
        assert by_generation[promoted["generation"]]["sft_steps"] == 0  # GRPO only, from the best
        assert by_generation[promoted["generation"]]["parent_sha256"] is not None
    except AssertionError:
        print(tail(files, 6000))
        raise
    finally:
        kill_group(proc)
