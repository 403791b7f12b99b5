#!/usr/bin/env python
"""Run the single-node training loop for a fixed wall-clock budget and report what it made.

    python scripts/bench_loop.py --minutes 20

Starts the real orchestrator (configs/bench_loop.yaml by default) on a fresh data dir, stops
it with SIGTERM when the budget is spent, then measures the last promoted generation against
random and the heuristic with a fresh gauntlet. Prints one JSON object: games, positions/s,
generations promoted/rejected, Elo of each generation vs random (anchored at 0), the share of
wall time each pipeline stage took, and the final model's scores.

    python scripts/bench_loop.py --minutes 15 --config configs/lm_copy.yaml

A config with `workload: lm` runs the language-model loop instead and reports, per decided
generation, the held-out reward with its interval and exact match against wall time, the
rollout groups (and samples) per second, and the same stage shares.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.config import load_settings  # noqa: E402
from app.db.registry import ModelRegistry, ModelStatus  # noqa: E402
from app.log import epoch_of  # noqa: E402
from app.db.replay_db import ReplayDB  # noqa: E402
from app.db.rollout_store import RolloutStore  # noqa: E402
from app.games.train.gauntlet import run_gauntlet  # noqa: E402


def stage_shares(history: list[dict], started: float, ended: float) -> dict[str, float]:
    """Fraction of the wall time spent in each stage (collecting = waiting for games)."""
    spans: dict[str, float] = {}
    stage, since = "collecting", started
    for event in history:
        spans[stage] = spans.get(stage, 0.0) + max(0.0, epoch_of(event) - since)
        stage, since = event["stage"], epoch_of(event)
    spans[stage] = spans.get(stage, 0.0) + max(0.0, ended - since)
    total = sum(spans.values()) or 1.0
    return {k: round(v / total, 3) for k, v in sorted(spans.items())}


def run_loop(config: Path | None, daemons: Path, data_dir: Path, minutes: float,
             on_tick: Callable[[int], bool | None] | None = None, tick_s: float = 2.0) -> tuple[float, float]:
    """Run one orchestrator on `data_dir` for `minutes` (SIGTERM, then SIGKILL after a grace);
    (started, ended) wall-clock times. `on_tick(pid)` is called every `tick_s` while it runs
    (a sampler's hook); a true answer ends the run there (a CPU budget spent). Its log goes to
    `<data_dir>.log` beside the data dir."""
    cmd = [sys.executable, "-m", "app.p2p_orchestrator", "--daemons", str(daemons), "--data-dir", str(data_dir),
           "--port", "0", "--health-port", "0", "--node-id", "bench"]
    if config is not None:
        cmd += ["--config", str(config)]
    started = time.time()
    deadline = started + minutes * 60
    # The loop runs in its own session, so a SIGTERM to the bench would orphan it: turn the
    # signal into SystemExit here, and the `finally` below takes the loop's process group down.
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with open(data_dir.parent / f"{data_dir.name}.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
        try:
            while proc.poll() is None and time.time() < deadline:
                if on_tick is not None and on_tick(proc.pid):
                    break
                try:
                    proc.wait(timeout=max(0.0, min(tick_s, deadline - time.time())))
                except subprocess.TimeoutExpired:
                    pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            _stop_group(proc)
    return started, time.time()


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM (the orchestrator stops its daemons and workers), SIGKILL after a 60 s grace;
    then whatever of its process group is left."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def game_counts(data_dir: Path) -> tuple[int, int]:
    """(games, positions the search played) stored by the loop; random openings' moves do not count."""
    if not (data_dir / "games.db").exists():
        return 0, 0
    with ReplayDB(data_dir / "games.db") as db:
        return db.count(), db.count_searched_positions()


def pipeline_history(data_dir: Path) -> list[dict]:
    history_file = data_dir / "pipeline_history.jsonl"
    return [json.loads(x) for x in history_file.read_text().splitlines()] if history_file.exists() else []


def final_scores(model_path: str, settings, simulations: int, games: int, data_dir: Path) -> dict:
    """The final model vs random and the heuristic at one MCTS budget, in a fresh registry."""
    eval_settings = settings.model_copy(update={"gauntlet": settings.gauntlet.model_copy(
        update={"games_vs_baseline": games, "workers": 2, "net_simulations": simulations})})
    report = run_gauntlet(model_path, ["random", "heuristic"], None, eval_settings,
                          data_dir / f"final_eval_{simulations}.db", workers=2, seed=12345)
    return {**{f"score_vs_{r.kind}": round(r.score, 3) for r in report.results},
            **{f"wdl_vs_{r.kind}": [r.wins, r.draws, r.losses] for r in report.results}}


def lm_report(data_dir: Path, settings, started: float, ended: float) -> dict:
    """The language-model loop: held-out reward by generation against wall time."""
    heldout_file = data_dir / "heldout.json"
    heldout = json.loads(heldout_file.read_text()) if heldout_file.exists() else {}
    with ModelRegistry(data_dir / "registry.db") as registry:
        models = {m.sha256: m for m in registry.models()}
    rows = []
    for sha, h in sorted(heldout.items(), key=lambda kv: kv[1]["generation"]):
        m = models.get(sha)
        decided_at = (m.promoted_at or m.updated_at) if m is not None else started
        rows.append({"generation": h["generation"], "status": m.status.value if m else "initial",
                     "minutes": round((decided_at - started) / 60, 2), "reward": round(h["reward"], 3),
                     "interval": [round(x, 3) for x in h["interval"]], "exact_match": round(h["exact_match"], 3)})
    groups = 0
    if (data_dir / "rollouts.db").exists():
        with RolloutStore(data_dir / "rollouts.db") as store:
            groups = store.count()
    wall = ended - started
    statuses = [m.status for m in models.values()]
    return {"workload": "lm", "minutes": round(wall / 60, 2), "data_dir": str(data_dir), "rollout_groups": groups,
            "groups_per_second": round(groups / wall, 2),
            "samples_per_second": round(groups * settings.lm.rollout.n / wall, 1),
            "generations_promoted": statuses.count(ModelStatus.PROMOTED),
            "generations_rejected": statuses.count(ModelStatus.REJECTED),
            "heldout_by_generation": rows, "stage_share": stage_shares(pipeline_history(data_dir), started, ended)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=20.0)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "bench_loop.yaml")
    p.add_argument("--daemons", type=Path, help="daemons file (default: configs/bench_loop_daemons.yaml; "
                                                "configs/bench_loop_lm_daemons.yaml for workload: lm)")
    p.add_argument("--data-dir", type=Path, default=None)
    p.add_argument("--eval-games", type=int, default=40, help="games vs each baseline for the final model")
    p.add_argument("--eval-sims", default="",
                   help="comma-separated MCTS budgets the final model is also measured at (default: the config's only)")
    args = p.parse_args()
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="bench_loop_"))
    settings = load_settings(args.config)
    daemons = args.daemons or ROOT / "configs" / ("bench_loop_lm_daemons.yaml" if settings.workload == "lm"
                                                  else "bench_loop_daemons.yaml")
    started, ended = run_loop(args.config, daemons, data_dir, args.minutes)
    if settings.workload == "lm":
        print(json.dumps(lm_report(data_dir, settings, started, ended)))
        return 0

    games, positions = game_counts(data_dir)
    history = pipeline_history(data_dir)
    with ModelRegistry(data_dir / "registry.db") as registry:
        models = registry.models()
        best = registry.current_best()
    elo = [{"generation": m.generation, "status": m.status.value, "elo": m.elo, "elo_low": m.elo_low,
            "elo_high": m.elo_high} for m in models]
    final = {}
    if best is not None:
        budgets = [settings.gauntlet.net_simulations, *(int(x) for x in args.eval_sims.split(",") if x.strip())]
        final = {"generation": best.generation}
        for sims in dict.fromkeys(budgets):  # the config's budget first, each budget once
            final[f"simulations_{sims}"] = final_scores(best.path, settings, sims, args.eval_games, data_dir)
    wall = ended - started
    print(json.dumps({
        "minutes": round(wall / 60, 2), "data_dir": str(data_dir), "games": games,
        "positions_per_second": round(positions / wall, 1),
        "generations_promoted": sum(m.status is ModelStatus.PROMOTED for m in models),
        "generations_rejected": sum(m.status is ModelStatus.REJECTED for m in models),
        "elo_by_generation": elo, "stage_share": stage_shares(history, started, ended),
        "final_model": final,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
