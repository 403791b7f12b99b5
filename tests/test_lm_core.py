"""The language-model contract pieces: tokenizer, model, samples, tasks, in-process engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from app.lm.calculator import CalculatorError, evaluate
from app.lm.rollout.engine import InProcessEngine
from app.lm.causal_lm import (
    LMModelConfig,
    build_model,
    count_parameters,
    load_model,
    save_model,
)
from app.lm.samples import Group, Sample
from app.lm.tasks import CalculatorTask, DigitTask, Prompt, positional_credit, split_of
from app.lm.tokenizer import build_digit_tokenizer, load_tokenizer, save_tokenizer

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def tok():
    return build_digit_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return build_model(LMModelConfig(seed=3), tok)


def test_tokenizer_round_trip_markers_and_offline_reload(tok, tmp_path, monkeypatch):
    text = "calc:12*(3-4)=<call>12*(3-4)</call><result>-12</result>-12"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert tok.convert_tokens_to_ids("<call>") in ids and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok("rev:12", add_special_tokens=False)["input_ids"] == [tok.convert_tokens_to_ids("rev:"),
                                                                    tok.convert_tokens_to_ids("1"),
                                                                    tok.convert_tokens_to_ids("2")]
    assert len({tok.pad_token_id, tok.bos_token_id, tok.eos_token_id}) == 3
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_tokenizer(tok, tmp_path / "tok")
    assert (tmp_path / "tok" / "tokenizer.json").is_file()
    again = load_tokenizer(tmp_path / "tok")
    assert again(text)["input_ids"] == ids and again.eos_token_id == tok.eos_token_id
    with pytest.raises(ValueError, match="missing is not a local directory"):
        load_tokenizer(tmp_path / "missing")


def test_model_size_save_and_load_same_logits(tok, model, tmp_path, monkeypatch):
    assert 60_000 <= count_parameters(model) <= 90_000
    again = build_model(LMModelConfig(seed=3), tok)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values()))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    save_model(model, tok, tmp_path / "m")
    loaded = load_model(tmp_path / "m")
    x = torch.tensor([tok("copy:123=")["input_ids"]])
    torch.testing.assert_close(loaded(x).logits, model(x).logits, rtol=0, atol=0)
    assert load_tokenizer(tmp_path / "m")("copy:1")["input_ids"] == tok("copy:1")["input_ids"]
    with pytest.raises(ValueError, match="divide"):
        build_model(LMModelConfig(heads=3), tok)


def _sample(**overrides) -> Sample:
    fields = {"prompt_id": "p", "group_index": 0, "prompt_tokens": [1, 5], "response_tokens": [12, 2],
              "loss_mask": [1, 1], "rollout_logprobs": [-0.5, -0.1], "reward": 1.0, "weight_version": 4,
              "finish_reason": "stop", "terminated": True, "truncated": False, "truncation_reason": None}
    return Sample(**(fields | overrides))


def test_samples_validate_and_round_trip():
    s = _sample()
    assert Sample.from_dict(s.to_dict()) == s and s.tokens == [1, 5, 12, 2]
    with pytest.raises(ValueError, match="loss_mask"):
        _sample(loss_mask=[1])
    with pytest.raises(ValueError, match="truncation_reason"):
        _sample(truncated=True, terminated=False)
    with pytest.raises(ValueError, match="finish_reason"):
        _sample(finish_reason="eos")
    g = Group("p", [s, _sample(group_index=1, weight_version=2)], weight_version=4)
    assert Group.from_dict(g.to_dict()) == g and g.oldest_version == 2
    with pytest.raises(ValueError, match="holds a sample of prompt q"):
        Group("p", [_sample(prompt_id="q")], weight_version=0)


def test_digit_tasks_prompts_rewards_and_split():
    copy = DigitTask("copy", 3, 3)
    train = copy.make_prompts(50, seed=1)
    assert train == copy.make_prompts(50, seed=1) and len({p.prompt_id for p in train}) == 50
    test = copy.make_prompts(20, seed=1, split="test")
    assert not {p.text for p in train} & {p.text for p in test}
    assert all(split_of(p.answer) == "test" for p in test)
    p = train[0]
    assert copy.reward(p.record, copy.demonstration(p)) == 1.0 and copy.reward(p.record, p.answer[:2]) == 0.0
    rev = DigitTask("reverse", 3, 3, reward_kind="partial")
    q = Prompt("r", "rev:123=", "321")
    assert rev.reward(q.record, "321") == 1.0 and rev.reward(q.record, "021") == pytest.approx(2 / 3)
    assert rev.reward(q.record, "3210") == pytest.approx(3 / 4)
    assert positional_credit("", "") == 1.0
    with pytest.raises(ValueError, match="distinct"):
        DigitTask("copy", 1, 1).make_prompts(11, seed=0)


def test_calculator_task_and_tool():
    assert evaluate("12*(3-4)+-2") == -14 and evaluate("2+3*4") == 14
    for bad in ("1+", "(1", "1)", "a", "9" * 70):
        with pytest.raises(CalculatorError):
            evaluate(bad)
    task = CalculatorTask()
    prompts = task.make_prompts(10, seed=0)
    p = prompts[0]
    assert p.text.startswith("calc:") and p.answer == str(evaluate(p.text[5:-1]))
    assert task.reward(p.record, task.demonstration(p)) == 1.0 and task.reward(p.record, p.answer) == 1.0
    episode = task.new_episode(p)
    step = episode.step(f"<call>{p.text[5:-1]}</call>")
    assert step.observation == f"<result>{p.answer}</result>" and not step.terminated
    assert episode.step("<call>1+1</call>").truncated
    assert task.new_episode(p).step("<call>1+</call>").observation == "<result></result>"
    assert task.new_episode(p).step(p.answer).terminated


def _reference_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return [lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(tokens)]


def test_in_process_engine_logprobs_match_full_forward(tok, model):
    engine = InProcessEngine(model, tok, weight_version=7)
    prompts = [tok("copy:123=")["input_ids"], tok("calc:12*3+45=")["input_ids"]]
    out = engine.generate(prompts, n=3, max_new_tokens=10, temperature=1.0, seeds=[5, 6])
    assert [len(g) for g in out] == [3, 3]
    for prompt, group in zip(prompts, out):
        for c in group:
            assert len(c.tokens) == len(c.logprobs) >= 1
            assert (c.finish_reason == "stop") == (c.tokens[-1] == tok.eos_token_id)
            if c.finish_reason == "length":
                assert len(c.tokens) == 10
            assert c.logprobs == pytest.approx(_reference_logprobs(model, prompt, c.tokens), abs=1e-4)
    again = engine.generate(prompts, n=3, max_new_tokens=10, temperature=1.0, seeds=[5, 6])
    assert [[c.tokens for c in g] for g in again] == [[c.tokens for c in g] for g in out]
    # a completion is a function of (weights, prompt, seed): completion j of a prompt is seed + j,
    # whatever else shares the batch
    second = engine.generate([prompts[1]], n=1, max_new_tokens=10, temperature=1.0, seeds=[6 + 2])[0][0]
    assert second.tokens == out[1][2].tokens and second.logprobs == pytest.approx(out[1][2].logprobs, abs=1e-5)
    greedy = engine.generate(prompts, n=2, max_new_tokens=6, temperature=0, seeds=[0, 0])
    for prompt, group in zip(prompts, greedy):
        assert group[0].tokens == group[1].tokens
        alone = engine.generate([prompt], n=1, max_new_tokens=6, temperature=0, seeds=[9])[0][0]
        assert alone.tokens == group[0].tokens  # left padding does not change the answer


def test_in_process_engine_stops_on_marker_and_loads_weights(tok, model):
    engine = InProcessEngine(build_model(LMModelConfig(seed=3), tok), tok)
    prompt = tok("calc:1+2=")["input_ids"]
    free = engine.generate([prompt], n=1, max_new_tokens=4, temperature=0, seeds=[0])[0][0]
    first = free.tokens[0]
    assert first != tok.eos_token_id
    cut = engine.generate([prompt], n=2, max_new_tokens=4, temperature=0, seeds=[0], stop_token_ids=[first])[0]
    assert all(c.tokens == [first] and c.finish_reason == "stop" for c in cut)

    other = build_model(LMModelConfig(seed=4), tok)
    engine.load_weights(other.state_dict(), version=3)
    assert engine.weight_version == 3
    mine = engine.generate([prompt], n=1, max_new_tokens=6, temperature=0, seeds=[0])[0][0]
    theirs = InProcessEngine(other, tok).generate([prompt], n=1, max_new_tokens=6, temperature=0, seeds=[0])[0][0]
    assert (mine.tokens, mine.logprobs) == (theirs.tokens, theirs.logprobs) and mine.weight_version == 3
    with pytest.raises(RuntimeError):
        engine.load_weights({"nope": torch.zeros(1)}, version=4)
    assert engine.weight_version == 3
    with pytest.raises(ValueError, match="empty prompt"):
        engine.generate([[]], n=1, max_new_tokens=2, temperature=0, seeds=[0])


def test_fresh_offline_process_loads_the_same_model_and_tokenizer(tok, model, tmp_path):
    save_model(model, tok, tmp_path / "m")
    code = ("import sys, torch; torch.set_num_threads(1)\n"
            "from app.lm.causal_lm import load_model\nfrom app.lm.tokenizer import load_tokenizer\n"
            "tok = load_tokenizer(sys.argv[1]); m = load_model(sys.argv[1])\n"
            "ids = tok('rev:4711=')['input_ids']\n"
            "print(ids); print(m(torch.tensor([ids])).logits[0, -1].tolist())\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True, check=False,
                          env=env, timeout=90, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    ids_line, logits_line = done.stdout.strip().splitlines()[-2:]
    ids = tok("rev:4711=")["input_ids"]
    assert json.loads(ids_line) == ids
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(torch.tensor(json.loads(logits_line)), expected, rtol=0, atol=1e-6)
