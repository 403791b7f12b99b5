"""Agent steps and truncation semantics (items 9 and 10).

Most tests drive the episode loop with a scripted engine (it answers a fixed text per model
step, so every ending can be produced on purpose); one runs the real in-process engine on the
calculator task and checks the traces against a full forward pass.
"""

from __future__ import annotations

import pytest
import torch

from app.lm.rollout.agent import PrefixMismatchError, check_append_only, run_episodes
from app.lm.rollout.engine import Completion, InProcessEngine
from app.lm.causal_lm import LMModelConfig, build_model
from app.lm.rollout.groups import filter_reason, generate_groups
from app.lm.tasks import CalculatorTask, DigitTask, Prompt
from app.lm.tokenizer import build_digit_tokenizer
from app.lm.truncation import RolloutSettings

pytestmark = pytest.mark.timeout(120)
TOK = build_digit_tokenizer()
CALC = Prompt("calc:12*3+4", "calc:12*3+4=", "40")


class ScriptedEngine:
    """Answers model step k with `script[k]` (text, finish_reason); records every context it saw."""

    name = "scripted"

    def __init__(self, script: list[tuple[str, str]], weight_version: int = 5,
                 reported: list[int | None] | None = None) -> None:
        self.script, self.weight_version, self.contexts = script, weight_version, []
        self.reported = reported or [None] * len(script)   # version each step's completions claim

    def generate(self, prompt_token_lists, *, n, max_new_tokens, temperature, seeds, stop_token_ids=None):
        assert len(seeds) == len(prompt_token_lists)  # one sampling seed per request
        out = []
        for context in prompt_token_lists:
            self.contexts.append(list(context))
            step = sum(1 for c in self.contexts if c[: len(context)] == list(context)[: len(c)]) - 1
            text, reason = self.script[min(step, len(self.script) - 1)]
            tokens = TOK(text, add_special_tokens=False)["input_ids"][:max_new_tokens]
            if reason == "stop" and not text.endswith("</call>"):
                tokens.append(TOK.eos_token_id)
            version = self.reported[min(step, len(self.script) - 1)]
            out.append([Completion(tokens=tokens, logprobs=[-0.5] * len(tokens), finish_reason=reason,
                                   weight_version=version) for _ in range(n)])
        return out


def run(script, task=None, prompt=CALC, **settings):
    engine = ScriptedEngine(script)
    sample, = run_episodes(engine, task or CalculatorTask(), TOK, [(prompt, 0)],
                           RolloutSettings(**({"max_new_tokens": 32} | settings)), seed=0)
    return sample, engine


def ids(text: str) -> list[int]:
    return TOK(text, add_special_tokens=False)["input_ids"]


def test_two_turn_tool_call_concatenates_traces_with_masks():
    sample, engine = run([("<call>12*3+4</call>", "stop"), ("40", "stop")])
    call, result, answer = ids("<call>12*3+4</call>"), ids("<result>40</result>"), ids("40") + [TOK.eos_token_id]
    assert sample.response_tokens == call + result + answer
    assert sample.loss_mask == [1] * len(call) + [0] * len(result) + [1] * len(answer)
    assert sample.rollout_logprobs == [-0.5] * len(call) + [0.0] * len(result) + [-0.5] * len(answer)
    assert sample.reward == 1.0 and sample.terminated and not sample.truncated
    assert sample.finish_reason == "stop" and sample.metadata["steps"] == 2 and sample.weight_version == 5
    assert engine.contexts[1] == sample.prompt_tokens + call + result   # the second step saw the tool result


def test_sample_records_the_oldest_version_that_produced_any_of_its_steps():
    engine = ScriptedEngine([("<call>12*3+4</call>", "stop"), ("40", "stop")], weight_version=5, reported=[3, 6])
    sample, = run_episodes(engine, CalculatorTask(), TOK, [(CALC, 0)], RolloutSettings(max_new_tokens=32), seed=0)
    assert sample.weight_version == 3


def test_answering_without_the_tool_is_one_step():
    sample, _ = run([("41", "stop")])
    assert sample.metadata["steps"] == 1 and sample.terminated and sample.reward == 0.0


def test_max_steps_truncation():
    sample, _ = run([("<call>1+1</call>", "stop")], task=CalculatorTask(max_calls=10), max_steps=3)
    assert sample.truncated and sample.truncation_reason == "max_steps" and not sample.terminated
    assert sample.metadata["steps"] == 3 and sample.finish_reason == "stop"


def test_env_truncation_is_its_own_reason_and_scored_or_fixed_by_setting():
    script = [("<call>12*3+4</call>", "stop"), ("<call>40</call>", "stop")]
    sample, _ = run(script)
    assert sample.truncation_reason == "env" and sample.metadata["steps"] == 2
    assert sample.reward == 0.0   # scored on the text after the last result: "<call>40</call>" != "40"
    fixed, _ = run(script, truncated_reward=-1.0)
    assert fixed.truncation_reason == "env" and fixed.reward == -1.0


def test_length_is_scored_by_default_and_a_parse_failure_when_told():
    prompt = Prompt("copy:123", "copy:123=", "123")
    scored, _ = run([("123", "length")], task=DigitTask("copy"), prompt=prompt, parse_failure_reward=-1.0)
    assert scored.finish_reason == "length" and scored.reward == 1.0 and "parse_failure" not in scored.metadata
    failed, _ = run([("123", "length")], task=DigitTask("copy"), prompt=prompt, length_is_parse_failure=True)
    assert failed.finish_reason == "length" and failed.reward == 0.0
    assert failed.metadata["parse_failure"] == "length" and failed.terminated and not failed.truncated


@pytest.mark.parametrize("reward_setting,group_setting", [("zero", "keep"), ("score", "mask_loss"),
                                                          ("zero", "drop_group")])
def test_max_seq_len_cut_says_so_and_applies_settings(reward_setting, group_setting):
    prompt = Prompt("copy:123", "copy:123=", "123")
    sample, _ = run([("1234567", "stop")], task=DigitTask("copy", reward_kind="partial"), prompt=prompt,
                    max_seq_len=9, overlong_reward=reward_setting, overlong_group=group_setting)
    assert len(sample.prompt_tokens) + len(sample.response_tokens) == 9   # 6 prompt tokens, "123" kept
    assert sample.truncated and sample.truncation_reason == "max_seq_len" and not sample.terminated
    assert sample.finish_reason == "stop"   # the engine's reason is kept apart from the cut
    assert sample.metadata["overlong"] == group_setting
    assert sample.reward == (0.0 if reward_setting == "zero" else 1.0)   # partial credit of "123" is 1.0
    assert sample.loss_mask == ([0] * 3 if group_setting == "mask_loss" else [1] * 3)


def test_overlong_drop_group_setting_is_applied_by_the_filter():
    from app.lm.samples import Group
    prompt = Prompt("copy:123", "copy:123=", "123")
    cut, _ = run([("1234567", "stop")], task=DigitTask("copy"), prompt=prompt, max_seq_len=8,
                 overlong_group="drop_group")
    fine, _ = run([("9", "stop")], task=DigitTask("copy"), prompt=prompt)
    fine.group_index = 1
    assert filter_reason(Group("copy:123", [cut, fine], weight_version=5)) == "overlong"


def test_tool_result_that_overflows_max_seq_len_is_cut():
    sample, _ = run([("<call>12*3+4</call>", "stop"), ("40", "stop")], max_seq_len=len(ids(CALC.text)) + 10)
    assert sample.truncation_reason == "max_seq_len" and sample.metadata["steps"] == 1
    assert sample.response_tokens[-1] == TOK.convert_tokens_to_ids("<result>") and sample.loss_mask[-1] == 0


def test_prefix_check_fails_loudly_when_a_context_is_rewritten():
    check_append_only([1, 2, 3], [1, 2, 3, 4], "ok")
    with pytest.raises(PrefixMismatchError, match="first difference at token 1"):
        check_append_only([1, 2, 3], [1, 9, 3, 4], "ep")
    with pytest.raises(PrefixMismatchError, match="lengths 3 -> 2"):
        check_append_only([1, 2, 3], [1, 2], "ep")

    def sliding_window(trace, observation):   # a builder that drops the oldest turn
        return trace.prompt_tokens + trace.response[3:] + observation

    engine = ScriptedEngine([("<call>12*3+4</call>", "stop"), ("40", "stop")])
    with pytest.raises(PrefixMismatchError, match="calc:12\\*3\\+4#0 step 1"):
        run_episodes(engine, CalculatorTask(), TOK, [(CALC, 0)], RolloutSettings(max_new_tokens=32),
                     seed=0, builder=sliding_window)


def test_real_engine_traces_match_a_full_forward_and_groups_are_whole():
    torch.set_num_threads(1)
    model = build_model(LMModelConfig(seed=2), TOK)
    engine = InProcessEngine(model, TOK, weight_version=9)
    task = CalculatorTask(max_calls=3)
    prompts = task.make_prompts(3, seed=0)
    settings = RolloutSettings(n=4, max_new_tokens=6, max_steps=3, max_seq_len=40, length_is_parse_failure=False)
    groups = generate_groups(engine, task, TOK, prompts, settings, seed=1)
    assert [g.prompt_id for g in groups] == [p.prompt_id for p in prompts]
    for group in groups:
        assert sorted(s.group_index for s in group.samples) == [0, 1, 2, 3] and group.weight_version == 9
        for s in group.samples:
            assert s.terminated or s.truncated
            assert len(s.tokens) <= 40
            with torch.no_grad():
                logits = model(torch.tensor([s.tokens])).logits[0].float()
            ref = torch.log_softmax(logits, -1)
            start = len(s.prompt_tokens)
            for i, (tok, m, lp) in enumerate(zip(s.response_tokens, s.loss_mask, s.rollout_logprobs)):
                if m:
                    assert lp == pytest.approx(ref[start + i - 1, tok].item(), abs=1e-4)
                else:
                    assert lp == 0.0
