"""Promotion: the pure gate, real gauntlets through the gate, sha256 checks, CLI round trips."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from app.games.search.heuristic import heuristic_move
from app.games.search.model import Architecture, ModelMeta, new_model, save_model
from app.config import load_settings
from app.config.pipeline import PromotionConfig
from app.db.registry import ModelRegistry, ModelStatus
from app.games import get_game
from app.games.train.gauntlet import OpponentResult
from app.games.train.promotion import (
    Gates, PromotionError, decide_promotion, evaluate_candidate, progress_report, promote_model,
    register_candidate, rollback_model,
)
from app.games.train.sprt import SprtDecision, SprtResult

REPO = Path(__file__).resolve().parent.parent
GAME = get_game("connect4")
ARCH = Architecture(32, 1, GAME.plane_shape, GAME.num_actions)


def train_tiny_net(path: Path, seed: int = 0, games: int = 200, epochs: int = 12) -> None:
    """Supervised learning on positions labelled by the depth-2 heuristic (policy) and game
    results (value); games mix heuristic and random moves so positions vary. ~20 s on one core."""
    rng = np.random.default_rng(seed)
    planes, targets, values = [], [], []
    for _ in range(games):
        state, seen = GAME.initial_state(), []
        while not state.is_terminal:
            best = heuristic_move(state, 2, rng)
            seen.append((state.planes(), best, state.to_move))
            state = state.play(best if rng.random() > 0.35 else int(rng.choice(state.legal_moves())))
        for p, a, mover in seen:
            z = 0.0 if state.winner is None else (1.0 if state.winner == mover else -1.0)
            planes += [p, p[..., ::-1].copy()]  # and the mirror image
            targets += [a, GAME.num_actions - 1 - a]
            values += [z, z]
    x = torch.tensor(np.array(planes))
    pi, z = torch.tensor(targets), torch.tensor(values, dtype=torch.float32)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = new_model(ARCH)
        opt = torch.optim.Adam(net.parameters(), lr=3e-3)
        net.train()
        for _ in range(epochs):
            perm = torch.randperm(len(x))
            for i in range(0, len(x), 128):
                idx = perm[i:i + 128]
                logits, v = net(x[idx])
                loss = torch.nn.functional.cross_entropy(logits, pi[idx]) + torch.nn.functional.mse_loss(v, z[idx])
                opt.zero_grad()
                loss.backward()
                opt.step()
    save_model(net, ModelMeta(ARCH, "connect4", generation=1), path)


def random_net(path: Path, seed: int, generation: int = 0, parent: str | None = None) -> str:
    meta = save_model(new_model(ARCH, seed=seed), ModelMeta(ARCH, "connect4", generation, parent, "d" * 64), path)
    return str(meta.sha256)


def cli_main(*args: str, capsys) -> tuple[int, str, str]:
    """The CLI's main() in this process (no torch import per call); one test also spawns it."""
    spec = importlib.util.spec_from_file_location("auto_promote_cli", REPO / "scripts" / "auto_promote.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    capsys.readouterr()
    rc = module.main(list(args))
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([sys.executable, str(REPO / "scripts" / "auto_promote.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# --- the pure gate ---------------------------------------------------------------------------

def result(kind: str, w: int, d: int, l: int, decision: SprtDecision | None = None) -> OpponentResult:
    sprt = None if decision is None else SprtResult(decision, 0.0, -2.94, 2.94, w + d + l)
    return OpponentResult(kind, kind, w, d, l, sprt)


counts = st.tuples(st.integers(0, 30), st.integers(0, 30), st.integers(0, 30))


@settings(max_examples=400, deadline=None)
@given(
    vs_random=st.none() | counts, vs_heuristic=st.none() | counts,
    vs_best=st.none() | st.tuples(counts, st.sampled_from(list(SprtDecision))),
    t_random=st.none() | st.floats(0.0, 1.0), t_heuristic=st.none() | st.floats(0.0, 1.0),
    require_sprt=st.booleans(), has_best=st.booleans(), overrides=st.booleans(),
)
def test_gate_promotes_exactly_when_every_configured_gate_passes(
    vs_random, vs_heuristic, vs_best, t_random, t_heuristic, require_sprt, has_best, overrides,
) -> None:
    results = []
    if vs_random is not None:
        results.append(result("random", *vs_random))
    if vs_heuristic is not None:
        results.append(result("heuristic", *vs_heuristic))
    if vs_best is not None:
        results.append(result("best", *vs_best[0], decision=vs_best[1]))
    gates = Gates(t_random, t_heuristic, require_sprt, overrides)
    decision = decide_promotion(results, gates, has_best)

    def passes(c, threshold) -> bool:
        if threshold is None:
            return True
        return c is not None and sum(c) > 0 and (c[0] + 0.5 * c[1]) / sum(c) >= threshold

    sprt_accepts = vs_best is not None and vs_best[1] is SprtDecision.ACCEPT
    baselines = passes(vs_random, t_random) and passes(vs_heuristic, t_heuristic)
    beat_best = has_best and require_sprt and overrides and sprt_accepts  # baselines then only report
    expected = (baselines or beat_best) and (not has_best or not require_sprt or sprt_accepts)
    assert decision.promote is expected
    assert any(r.startswith("fail") for r in decision.reasons) is (not expected)
    assert any(r.startswith("overridden") for r in decision.reasons) is (beat_best and not baselines)


def test_a_candidate_that_beat_the_best_is_not_thrown_away_by_a_baseline_threshold() -> None:
    """The guide's case: generation 2 beat the best in the SPRT, scored under 0.5 vs the heuristic."""
    results = [result("random", 20, 0, 0), result("heuristic", 7, 2, 11), result("best", 30, 5, 10, SprtDecision.ACCEPT)]
    decision = decide_promotion(results, Gates(), has_best=True)
    assert decision.promote and "overridden (the SPRT accepts it vs the best): score 0.400 vs heuristic" in decision.summary()
    strict = decide_promotion(results, Gates(sprt_overrides_baselines=False), has_best=True)
    assert not strict.promote and "fail: score 0.400 vs heuristic < 0.50" in strict.summary()


def test_generation_zero_is_judged_on_baselines_alone() -> None:
    results = [result("random", 20, 0, 0), result("heuristic", 12, 0, 8)]
    decision = decide_promotion(results, Gates(), has_best=False)
    assert decision.promote and "generation 0" in decision.summary()
    decision = decide_promotion(results, Gates(), has_best=True)  # a best exists: SPRT required
    assert not decision.promote and "no SPRT" in decision.summary()
    undecided = results + [result("best", 60, 20, 55, SprtDecision.CONTINUE)]
    assert "game cap" in decide_promotion(undecided, Gates(), has_best=True).summary()


def test_without_gates_every_candidate_is_promoted_and_the_record_says_why() -> None:
    """Continuous promotion (AlphaZero): no threshold, no SPRT; even a candidate that lost every
    game to the best is promoted, and the decision names the configuration, never an empty reason."""
    gates = Gates(min_score_vs_random=None, min_score_vs_heuristic=None, require_sprt_vs_best=False)
    decision = decide_promotion([result("best", 0, 0, 20, SprtDecision.REJECT)], gates, has_best=True)
    assert decision.promote and decision.summary() == (
        "pass: no gate configured (every candidate is promoted; the gauntlet only measures)")


# --- real gauntlets through the gate --------------------------------------------------------

@pytest.fixture(scope="module")
def trained_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("trained") / "gen1.safetensors"
    train_tiny_net(path)
    return path


@pytest.mark.timeout(240)
def test_a_trained_net_passes_the_gate_vs_random(trained_model: Path, tmp_path: Path) -> None:
    settings = load_settings(None, gauntlet={"net_simulations": 128},
                             promotion={"min_score_vs_random": 0.95, "min_score_vs_heuristic": None})
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        outcome = evaluate_candidate(trained_model, settings, registry, workers=1, seed=0, games_per_baseline=20)
        assert outcome.decision.promote, outcome.decision.reasons
        assert outcome.report.result("random").score >= 0.95
        assert outcome.entry.status is ModelStatus.PROMOTED
        assert registry.current_best().sha256 == outcome.entry.sha256
        assert outcome.entry.elo is not None and outcome.entry.elo_low < outcome.entry.elo < outcome.entry.elo_high
        # Elo is relative to the fixed anchor every gauntlet plays (a few games by default)
        assert outcome.report.anchor == "heuristic-d2"
        assert outcome.report.result("anchor").games == settings.gauntlet.games_vs_anchor
        elo = {r.player: r.elo for r in outcome.report.ratings}
        assert elo["heuristic-d2"] == 0.0 and outcome.entry.elo - elo["random"] > 300
        with pytest.raises(PromotionError, match="already promoted"):
            evaluate_candidate(trained_model, settings, registry, workers=1, games_per_baseline=2)


@pytest.mark.timeout(240)
def test_a_random_net_fails_the_gate_vs_the_heuristic(tmp_path: Path) -> None:
    path = tmp_path / "gen2.safetensors"
    random_net(path, seed=3, generation=2)  # from generation 2 on, the configured gates include the heuristic
    settings = load_settings(None, gauntlet={"net_simulations": 24},
                             promotion={"min_score_vs_random": 0.95, "min_score_vs_heuristic": 0.5})
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        outcome = evaluate_candidate(path, settings, registry, workers=1, seed=1, games_per_baseline=10)
        assert not outcome.decision.promote
        assert any(r.startswith("fail") and "heuristic" in r for r in outcome.decision.reasons)
        assert outcome.report.result("heuristic").score < 0.5
        assert outcome.entry.status is ModelStatus.REJECTED
        assert "heuristic" in outcome.entry.reason
        assert registry.current_best() is None


# --- sha256 checks, rollback, progress --------------------------------------------------------

def test_promotion_refuses_a_file_whose_sha256_changed(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    random_net(path, seed=1)
    with ModelRegistry(tmp_path / "reg.sqlite") as registry:
        entry = register_candidate(registry, path)
        random_net(path, seed=2)  # the file is replaced after registration
        with pytest.raises(PromotionError, match="refusing"):
            promote_model(registry, entry.sha256, "gate passed")
        assert registry.get(entry.sha256).status is ModelStatus.CANDIDATE
        path.unlink()
        with pytest.raises(PromotionError, match="missing"):
            promote_model(registry, entry.sha256, "gate passed")


@pytest.mark.timeout(120)
def test_cli_promote_rollback_and_progress_round_trip(tmp_path: Path, capsys) -> None:
    reg_path = tmp_path / "reg.sqlite"
    shas, parent = [], None
    with ModelRegistry(reg_path) as registry:
        for gen in range(3):
            path = tmp_path / f"gen{gen}.safetensors"
            parent = random_net(path, seed=10 + gen, generation=gen, parent=parent)
            shas.append(register_candidate(registry, path).sha256)
    for sha in shas:
        rc, _, err = cli_main("--registry", str(reg_path), "promote", sha[:10], capsys=capsys)
        assert rc == 0, err
    proc = run_cli("--registry", str(reg_path), "rollback", shas[0][:10], "--reason", "regression")
    assert proc.returncode == 0, proc.stderr
    assert shas[1][:12] in proc.stdout and shas[2][:12] in proc.stdout

    rc, out, err = cli_main("--registry", str(reg_path), "progress", capsys=capsys)
    assert rc == 0, err
    report = json.loads(out)
    assert report["format"] == 1 and report["current_best"] == shas[0]
    assert [m["generation"] for m in report["models"]] == [0, 1, 2]
    assert [m["status"] for m in report["models"]] == ["promoted", "rolled_back", "rolled_back"]
    assert report["models"][1]["parent_sha256"] == shas[0]
    assert report["models"][0]["current"] and report["models"][0]["promoted_at"] is not None
    assert set(report["models"][0]) >= {"sha256", "elo", "elo_low", "elo_high", "reason", "dataset_sha256"}

    # Roll forward again in-process, then a tampered file is refused by the CLI.
    with ModelRegistry(reg_path) as registry:
        assert rollback_model(registry, shas[2], "fixed") == []
        assert registry.current_best().sha256 == shas[2]
        assert progress_report(registry)["current_best"] == shas[2]
    random_net(tmp_path / "gen1.safetensors", seed=99, generation=1)
    rc, _, err = cli_main("--registry", str(reg_path), "rollback", shas[1][:10], capsys=capsys)
    assert rc == 2 and "refusing" in err
    rc, _, err = cli_main("--registry", str(reg_path), "promote", "ffff", capsys=capsys)
    assert rc == 2 and "no model" in err
    rc, out, _ = cli_main("--registry", str(reg_path), "list", capsys=capsys)
    assert rc == 0 and "rolled_back" in out


def test_the_first_generation_faces_no_heuristic_gate() -> None:
    gates = Gates(min_score_vs_random=0.9, min_score_vs_heuristic=0.5)
    first, later = gates.for_generation(1, heuristic_from=2), gates.for_generation(2, heuristic_from=2)
    assert first.baselines() == ["random"] and later.baselines() == ["random", "heuristic"]
    assert later is gates
    cfg = PromotionConfig(min_score_vs_random=0.9, min_score_vs_heuristic=0.5)  # the CLI and the daemons read one rule
    assert Gates.from_config(cfg, 1).baselines() == ["random"]
    assert Gates.from_config(cfg, cfg.heuristic_gate_from_generation).baselines() == ["random", "heuristic"]
