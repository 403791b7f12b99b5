"""The analysis CLI driven like an engine: one line in, one JSON line out, over a real pipe."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import SearchConfig
from app.games import get_game, result_scale
from tests.conftest import REPO

GAME = get_game("connect4")
# "2433354242571": column 6 wins on the next ply, worth what the default length discount leaves
# (analyze prints values rounded to 6 places)
_WIN_NEXT = GAME.parse("2433354242571")
IMMEDIATE_WIN = round(result_scale(_WIN_NEXT.ply + 1, _WIN_NEXT.max_plies, SearchConfig().length_discount), 6)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> Path:
    arch = Architecture(8, 1, GAME.plane_shape, GAME.num_actions)
    path = tmp_path_factory.mktemp("model") / "m.safetensors"
    save_model(new_model(arch, seed=0), ModelMeta(arch, GAME.name), path)
    return path


class Engine:
    """The CLI as a subprocess; `ask` writes one line and waits for exactly one answer."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "app.analyze", *args], cwd=REPO, text=True, bufsize=1,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            self.lines.put(line)

    def ask(self, line: str) -> dict:
        self.proc.stdin.write(line + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        # The answer must come while stdin is still open: flushed per line, not at exit.
        return json.loads(self.lines.get(timeout=30))

    def close(self) -> int:
        self.proc.stdin.close()  # type: ignore[union-attr]
        return self.proc.wait(20)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def check_answer(answer: dict, moves: str, searched: bool = True) -> None:
    state = GAME.parse(moves)
    # The stable keys stay; the network's own view comes beside them.
    assert set(answer) == {"moves", "policy", "value", "best_move", "net_policy", "net_value", "net_best_move",
                           "proven", "unsafe_moves"}
    # the columns that hand the opponent a win on the spot; the threat check never searches them
    # columns as the input numbers them, 1-7 (Pons); the policy lists columns 1-7 in order
    unsafe = [a + 1 for a in state.legal_moves() if any(state.play(a).play(b).winner is not None
                                                        for b in state.play(a).legal_moves())]
    assert answer["unsafe_moves"] == unsafe
    if searched and len(unsafe) < len(state.legal_moves()):
        assert all(answer["policy"][c - 1] == 0 for c in unsafe)
    if not searched:
        assert answer["proven"] is None
    assert answer["moves"] == moves
    for policy, best, value in (("policy", "best_move", "value"), ("net_policy", "net_best_move", "net_value")):
        assert len(answer[policy]) == 7 and abs(sum(answer[policy]) - 1.0) < 1e-4
        assert all(p == 0 for p, legal in zip(answer[policy], state.legal_mask()) if not legal)
        assert 1 <= answer[best] <= 7 and state.legal_mask()[answer[best] - 1]
        assert -1.0 <= answer[value] <= 1.0
    assert answer["net_best_move"] == 1 + max(range(7), key=lambda a: answer["net_policy"][a])


@pytest.mark.timeout(60)
def test_search_answers_line_by_line_and_survives_bad_lines(model_path: Path) -> None:
    engine = Engine("--model", str(model_path), "--sims", "48")
    try:
        check_answer(engine.ask("4453"), "4453")
        bad = engine.ask("44x")
        assert bad["moves"] == "44x" and "bad character" in bad["error"]
        full = engine.ask("4444444")
        assert "column 4 is full" in full["error"]
        over = engine.ask("1212121")
        assert "game is over" in over["error"]
        check_answer(engine.ask(""), "")  # the starting position
        win = engine.ask("2433354242571")  # from a Pons position: column 6 wins at once
        check_answer(win, "2433354242571")
        assert win["best_move"] == 6 and win["value"] == win["proven"] == IMMEDIATE_WIN
        block = engine.ask("4455661")  # a double threat against the side to move: every move loses
        check_answer(block, "4455661")
        assert block["unsafe_moves"] == [1, 2, 3, 4, 5, 6, 7] and block["proven"] == pytest.approx(
            -result_scale(9, 42, SearchConfig().length_discount), abs=1e-6)
        check_answer(engine.ask("  4453  "), "4453")
        assert engine.close() == 0
    finally:
        engine.kill()


@pytest.mark.timeout(60)
def test_sims_zero_is_the_raw_network(model_path: Path) -> None:
    engine = Engine("--model", str(model_path), "--sims", "0")
    try:
        first = engine.ask("444444")
        check_answer(first, "444444", searched=False)
        assert first["policy"][3] == 0
        assert engine.ask("444444") == first  # no search, no randomness
        # ... and it is the network's own output: a forward pass here, softmax over legal columns
        import torch

        from app.games.search.model import load_model
        net, _ = load_model(model_path)
        state = get_game("connect4").parse("444444")
        with torch.inference_mode():
            logits, value = net.eval()(torch.from_numpy(state.planes()[None]))
        logits = logits[0].masked_fill(~torch.from_numpy(state.legal_mask()), float("-inf"))
        assert first["policy"] == pytest.approx(torch.softmax(logits, 0).tolist(), abs=1e-5)
        assert first["value"] == pytest.approx(float(value.reshape(-1)[0]), abs=1e-5)
        assert "error" in engine.ask("8")
        assert engine.close() == 0
    finally:
        engine.kill()
    assert (first["net_policy"], first["net_value"], first["net_best_move"]) == (
        first["policy"], first["value"], first["best_move"])


@pytest.mark.timeout(60)
def test_search_answer_shows_the_raw_network_beside_it(model_path: Path) -> None:
    from app.games.search.evaluators import NetworkEvaluator
    from app.games.search.model import load_model

    engine = Engine("--model", str(model_path), "--sims", "64")
    try:
        answer = engine.ask("2433354242571")  # column 6 wins at once: the search finds it
        assert engine.close() == 0
    finally:
        engine.kill()
    check_answer(answer, "2433354242571")
    assert answer["best_move"] == 6 and answer["value"] == IMMEDIATE_WIN
    # the network's own policy and value for the position, whatever the search made of it
    net, _ = load_model(model_path)
    priors, values = NetworkEvaluator(net, GAME).evaluate([GAME.parse("2433354242571")])
    assert answer["net_policy"] == pytest.approx(priors[0].tolist(), abs=1e-5)
    assert answer["net_value"] == pytest.approx(float(values[0]), abs=1e-5)
    assert answer["net_best_move"] == int(priors[0].argmax()) + 1
    assert answer["policy"] != answer["net_policy"]


def test_a_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "app.analyze", "--model", str(tmp_path / "no.safetensors")],
                          cwd=REPO, capture_output=True, text=True, timeout=60, input="")
    assert proc.returncode == 2
    assert "model file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.timeout(60)
def test_columns_are_numbered_as_the_input_numbers_them(model_path: Path) -> None:
    """Pons 1-7 in and out: after 232323 the side to move wins at once in column 2 (its three
    stones there), and any column but 2 and 3 lets the opponent complete column 3: the answer
    names them as the input would write them; --help says so."""
    engine = Engine("--model", str(model_path), "--sims", "32")
    try:
        answer = engine.ask("232323")
        assert engine.close() == 0
    finally:
        engine.kill()
    assert answer["best_move"] == 2 and answer["unsafe_moves"] == [1, 4, 5, 6, 7]
    helped = subprocess.run([sys.executable, "-m", "app.analyze", "--help"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "1-7" in helped.stdout and "the first column is 1" in helped.stdout
