"""Self-play speed, measured side by side in one run; prints ONE JSON object.

- ceiling: raw network evaluations per second at the search's batch size (no search),
  best of short windows taken before and after the search run;
- MCTS self-play with the default net: simulations/s, network evaluations/s and positions
  (moves played)/s over `--concurrent` games at once, and their ratio to the ceiling (the
  share of the network's throughput the search keeps; aim >= 0.6 at 64+ games);
- what making a leaf's network input costs, one state at a time against the game's batch
  (`leaf_input_us`: `Game.stacked_planes` and `stacked_legal_masks`, NetworkEvaluator's way);
- the same search with the uniform evaluator (pure search overhead, no network), with and
  without the threat check (`search.threat_check`: what looking one ply deep costs a node);
- random playouts/s of the vectorised engine vs a pure-Python loop of `state.play`, and of
  open_spiel's connect_four when it is importable;
- what a batch of small games costs with a worker spawned for it vs a worker kept in a
  `selfplay_pool.WorkerPool` (the self-play daemon's way): wall and CPU seconds per batch.

    python scripts/bench_selfplay.py [--concurrent 64] [--sims 64] [--moves 6] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.ai.evaluators import NetworkEvaluator, UniformEvaluator  # noqa: E402
from app.ai.mcts import SearchTree, choose_action, run_searches, temperature_for_ply  # noqa: E402
from app.ai.model import Architecture, new_model, predict  # noqa: E402
from app.config import Settings  # noqa: E402
from app.games import get_game  # noqa: E402
from app.games.connect4_playouts import random_playouts  # noqa: E402
from app.log import configure_logging  # noqa: E402
from app.shared.process_group import DEVICE_CHOICES, network_device  # noqa: E402


def ceiling(net, states, windows: int = 3, seconds: float = 1.0) -> float:
    """Best rate over several short windows: on a shared machine the best window is the
    closest to the hardware's ceiling, which keeps the search's ratio conservative."""
    planes = np.stack([s.planes() for s in states])
    legal = np.stack([s.legal_mask() for s in states])
    predict(net, planes, legal)  # warm-up
    best = 0.0
    for _ in range(windows):
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            predict(net, planes, legal)
            n += len(states)
        best = max(best, n / (time.perf_counter() - start))
    return best


def leaf_input_us(game, states, repeats: int = 200) -> dict:
    """What making the network's input costs a leaf, side by side: one state at a time
    (`planes()`, `legal_mask()`) against the game's batch (`stacked_planes`, `stacked_legal_masks`,
    what NetworkEvaluator uses)."""
    def per_state() -> None:
        np.stack([s.planes() for s in states]), np.stack([s.legal_mask() for s in states])

    def stacked() -> None:
        game.stacked_planes(states), game.stacked_legal_masks(states)

    times = {}
    for name, make in (("per_state", per_state), ("stacked", stacked), ("per_state_again", per_state)):
        make()
        start = time.perf_counter()
        for _ in range(repeats):
            make()
        times[name] = (time.perf_counter() - start) / repeats / len(states) * 1e6
    return {"per_state_us": round(min(times["per_state"], times["per_state_again"]), 2),
            "stacked_us": round(times["stacked"], 2)}


def selfplay_speed(game, evaluator, concurrent: int, sims: int, moves: int, settings: Settings, seed: int) -> dict:
    """Play `moves` plies in each of `concurrent` games (finished games restart)."""
    rng = np.random.default_rng(seed)
    trees = [SearchTree.for_search(game.initial_state(), settings.search) for _ in range(concurrent)]
    plies = [0] * concurrent
    run_searches(trees, evaluator, 1, settings.search, rng)  # expand roots outside the timing
    evals_before = evaluator.positions
    played = 0
    start = time.perf_counter()
    for _ in range(moves):
        results = run_searches(trees, evaluator, sims, settings.search, rng, add_noise=True)
        for i, (tree, result) in enumerate(zip(trees, results)):
            action = choose_action(result.visits, temperature_for_ply(plies[i], settings.search.temperature_moves), rng)
            tree.advance(action)
            plies[i] += 1
            played += 1
            if tree.root_state.is_terminal:
                trees[i], plies[i] = SearchTree.for_search(game.initial_state(), settings.search), 0
    seconds = time.perf_counter() - start
    return {
        "sims_per_s": round(played * sims / seconds, 1),
        "evals_per_s": round((evaluator.positions - evals_before) / seconds, 1),
        "positions_per_s": round(played / seconds, 2),
        "seconds": round(seconds, 2),
    }


def playout_speed(games: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    zeros = np.zeros(games, dtype=np.uint64)
    random_playouts(zeros, zeros, rng)  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        outcome = random_playouts(zeros, zeros, rng)
    numpy_rate = games * repeats / (time.perf_counter() - start)

    game = get_game("connect4")
    pyrng = random.Random(0)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        state = game.initial_state()
        while not state.is_terminal:
            state = state.play(pyrng.choice(state.legal_moves()))
        n += 1
    python_rate = n / (time.perf_counter() - start)

    out = {
        "numpy_games_per_s": round(numpy_rate),
        "python_loop_games_per_s": round(python_rate),
        "first_player_win_rate": round(float((outcome == 1).mean()), 4),
        "draw_rate": round(float((outcome == 0).mean()), 4),
        "batch": games,
    }
    try:
        import pyspiel  # type: ignore[import-not-found]
    except ImportError:
        out["open_spiel"] = "absent (pyspiel not importable)"
        return out
    sp_game = pyspiel.load_game("connect_four")
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 1.0:
        st = sp_game.new_initial_state()
        while not st.is_terminal():
            st.apply_action(pyrng.choice(st.legal_actions()))
        n += 1
    sp_rate = n / (time.perf_counter() - start)
    out["open_spiel_games_per_s"] = round(sp_rate)
    out["numpy_over_open_spiel"] = round(numpy_rate / sp_rate, 2)
    return out


def batch_start_up(batches: int, games: int, sims: int) -> dict:
    """Wall and CPU seconds per batch of `games` small games on one worker process, spawned
    per batch vs kept in a pool. The workers' CPU is counted once they are reaped."""
    import os
    import tempfile

    from app.training.selfplay import run_selfplay
    from app.training.selfplay_pool import WorkerPool

    tiny = Settings.model_validate({"model": {"channels": 8, "blocks": 1}, "selfplay": {"concurrent_games": games}})
    out: dict = {"batches": batches, "games_per_batch": games, "simulations": sims}
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("spawned_per_batch", "kept_in_pool"):
            pool = WorkerPool(1) if name == "kept_in_pool" else None
            t0, c0 = time.perf_counter(), os.times()
            for b in range(batches):
                run_selfplay(games=games, simulations=sims, db_path=Path(tmp) / f"{name}.db", workers=1, seed=b,
                             node_id="bench", settings=tiny, pool=pool)
            if pool is not None:
                pool.close()
            t1, c1 = time.perf_counter(), os.times()
            cpu = (c1.user - c0.user) + (c1.system - c0.system) + (c1.children_user - c0.children_user) + (
                c1.children_system - c0.children_system)
            out[name] = {"wall_s_per_batch": round((t1 - t0) / batches, 3), "cpu_s_per_batch": round(cpu / batches, 3)}
    out["cpu_ratio"] = round(out["spawned_per_batch"]["cpu_s_per_batch"] / out["kept_in_pool"]["cpu_s_per_batch"], 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--sims", type=int, default=64)
    ap.add_argument("--moves", type=int, default=6, help="plies timed per game")
    ap.add_argument("--channels", type=int, default=None)
    ap.add_argument("--blocks", type=int, default=None)
    ap.add_argument("--playout-batch", type=int, default=20000)
    ap.add_argument("--batches", type=int, default=5, help="small batches timed per worker strategy")
    ap.add_argument("--device", choices=DEVICE_CHOICES, default="cpu",
                    help="where the network evaluates (selfplay.device); the worker start-up part stays on CPU")
    args = ap.parse_args()
    configure_logging()  # the self-play runs below log; stdout carries only the one JSON object
    torch.set_num_threads(1)
    settings = Settings()
    game = get_game(settings.node.game)
    arch = Architecture(args.channels or settings.model.channels, args.blocks or settings.model.blocks,
                        game.plane_shape, game.num_actions)
    device = network_device(args.device)
    net = new_model(arch, seed=0).to(device).eval()

    # Positions a few plies in, like the leaves the search actually evaluates.
    rng = random.Random(0)
    states = []
    while len(states) < args.concurrent:
        s = game.initial_state()
        for _ in range(rng.randrange(4, 12)):
            if s.is_terminal:
                break
            s = s.play(rng.choice(s.legal_moves()))
        if not s.is_terminal:
            states.append(s)
    before = ceiling(net, states)
    net_play = selfplay_speed(game, NetworkEvaluator(net, game), args.concurrent, args.sims, args.moves, settings, 1)
    after = ceiling(net, states)  # measured on both sides of the search: the machine is shared
    ceiling_rate = max(before, after)
    uniform_play = selfplay_speed(game, UniformEvaluator(game), args.concurrent, args.sims, args.moves * 3, settings, 2)
    plain = settings.model_copy(update={"search": settings.search.model_copy(update={"threat_check": False})})
    uniform_plain = selfplay_speed(game, UniformEvaluator(game), args.concurrent, args.sims, args.moves * 3, plain, 2)
    playouts = playout_speed(args.playout_batch, repeats=5)
    start_up = batch_start_up(args.batches, games=8, sims=4)
    print(json.dumps({
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
        "net": {"channels": arch.channels, "blocks": arch.blocks, "device": str(device)},
        "concurrent_games": args.concurrent,
        "simulations": args.sims,
        "ceiling_net_evals_per_s": round(ceiling_rate, 1),
        "ceiling_before_after": [round(before, 1), round(after, 1)],
        "mcts_network": net_play,
        "mcts_sims_over_ceiling": round(net_play["sims_per_s"] / ceiling_rate, 3),
        "mcts_evals_over_ceiling": round(net_play["evals_per_s"] / ceiling_rate, 3),
        "mcts_uniform": uniform_play,
        "leaf_input_us": leaf_input_us(game, states),
        # Search bookkeeping per simulation, from the network-free run: what the ratio loses.
        "search_overhead_us_per_sim": round(1e6 / uniform_play["sims_per_s"], 1),
        "search_overhead_us_per_sim_without_threat_check": round(1e6 / uniform_plain["sims_per_s"], 1),
        "random_playouts": playouts,
        "batch_start_up": start_up,
    }))


if __name__ == "__main__":
    main()
