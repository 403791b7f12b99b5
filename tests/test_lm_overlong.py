"""`overlong_group: drop_group` in both loops: a group with a sample cut at max_seq_len trains
none of its tokens. The engine here answers each prompt in a known way (4-digit prompts run
past max_seq_len, shorter ones stop), so the trained-token count of a step is known exactly:
online (GeneratedGroups) the step's rows hold only the short prompts' tokens and the drops are
counted in its stats; offline the overlong groups are never stored (a tombstone with reason
"overlong" instead), so the exported dataset cannot train them. With `keep` they are trained."""

from __future__ import annotations

import threading

import pytest
import torch

from app.db.rollout_store import RolloutStore
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.rollout.batches import rollout_batch
from app.lm.rollout.engine import Completion
from app.lm.tasks import DigitTask
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.train.backend import LocalBackend, OptimConfig
from app.lm.train.grpo import sft_loss
from app.lm.train.rollout_sources import GeneratedGroups, LoopFilters
from app.lm.truncation import RolloutSettings

pytestmark = pytest.mark.timeout(120)
TOK = build_digit_tokenizer()
TASK = DigitTask("copy", 2, 4, "partial")
PROMPTS = TASK.make_prompts(40, 7, "train")
MAX_NEW, MAX_SEQ = 8, 12


def digits_of(text: str) -> str:
    return text.split("copy:")[-1].split("=")[0]


class AnsweringEngine:
    """Copies the prompt's digits and stops, except on 4-digit prompts, where it writes
    `MAX_NEW` nines (cut at MAX_SEQ); records the prompts it was asked."""

    name, kind, sync_mode, sync_timeout_s = "answering", "in_process", "tensor", 10.0

    def __init__(self) -> None:
        self.weight_version, self.in_service, self.last_error = 0, True, None
        self.lock = threading.Lock()
        self.asked: set[str] = set()

    def generate(self, contexts, *, n, max_new_tokens, temperature, seeds, stop_token_ids=None):
        out = []
        for context in contexts:
            digits = digits_of(TOK.decode(context, skip_special_tokens=True))
            self.asked.add(digits)
            if len(digits) == 4:
                tokens, reason = TOK("9" * max_new_tokens, add_special_tokens=False)["input_ids"], "length"
            else:
                tokens, reason = TOK(digits, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id], "stop"
            out.append([Completion(tokens=tokens, logprobs=[-0.1] * len(tokens), finish_reason=reason,
                                   weight_version=self.weight_version) for _ in range(n)])
        return out


def rollout(group_policy: str) -> RolloutSettings:
    return RolloutSettings(n=2, max_new_tokens=MAX_NEW, temperature=1.0, max_seq_len=MAX_SEQ,
                           overlong_group=group_policy, length_is_parse_failure=False)


def row_digits(row) -> str:
    """The digits of the prompt a training row continues (the tokens before its first trained one)."""
    return digits_of(TOK.decode(row.tokens[: row.loss_mask.index(1)], skip_special_tokens=True))


def one_online_step(group_policy: str):
    torch.set_num_threads(1)
    engine = AnsweringEngine()
    backend = LocalBackend(build_model(LMModelConfig(seed=1), TOK), OptimConfig(lr=1e-3), sft_loss)
    source = GeneratedGroups(engine, TASK, TOK, PROMPTS, seed=3, prompts_per_step=8, rollout=rollout(group_policy),
                             filters=LoopFilters(1.0, "keep", 1))  # only the overlong rule filters here
    return engine, source.batch(backend, 1)


def test_online_drop_group_trains_none_of_the_overlong_groups_tokens():
    engine, step = one_online_step("drop_group")
    long_asked = {d for d in engine.asked if len(d) == 4}
    assert long_asked, "the draw holds no 4-digit prompt: the check would be empty"
    assert step.stats["dropped_overlong"] == len(long_asked)
    trained = {row_digits(r) for r in step.rows}
    assert len(trained) == 8 and not any(len(d) == 4 for d in trained)
    # each kept sample trains its digits and its stop token, nothing else
    assert step.tokens == sum(sum(r.loss_mask) for r in step.rows) == sum(2 * (len(d) + 1) for d in trained)


def test_online_keep_trains_the_cut_groups():
    engine, step = one_online_step("keep")
    trained = [row_digits(r) for r in step.rows]
    assert step.stats["dropped_overlong"] == 0 and any(len(d) == 4 for d in trained)
    cut = [r for r in step.rows if len(row_digits(r)) == 4]
    assert all(len(r.tokens) == MAX_SEQ and sum(r.loss_mask) > 0 for r in cut)


def test_offline_drop_group_stores_none_of_the_overlong_groups(tmp_path):
    engine = AnsweringEngine()
    with RolloutStore(tmp_path / "rollouts.db") as store:
        result = rollout_batch(engine, TASK, TOK, PROMPTS[:16], rollout("drop_group"), store, node_id="n",
                               model_id="m", seed=1)
        long_prompts = [p for p in PROMPTS[:16] if len(p.answer) == 4]
        assert long_prompts and result.dropped == {"overlong": len(long_prompts)}
        assert result.stored == 16 - len(long_prompts)
        assert store.dropped_counts("n") == {"overlong": len(long_prompts)}
        assert not any(len(g.prompt_id.split(":")[-1]) == 4 for g in store.groups())
        again = rollout_batch(engine, TASK, TOK, PROMPTS[:16], rollout("drop_group"), store, node_id="n",
                              model_id="m", seed=1)
        assert again.already == 16 and again.stored == 0  # dropped groups are settled: not played again
