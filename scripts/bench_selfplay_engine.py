"""The parts of bench_selfplay.py around the search rather than in it, measured for the
default game (Connect Four: its bitboard engine and the node's processes), each a function
returning one JSON-able dict that bench_selfplay.py puts in its one object:

- `shared_network`: N search processes against one network server process (the GPU's
  stand-in on a CPU node): its evaluations/s, mean batch and each worker's share;
- `numpy_step_cost`: what a selection level and a threat check would cost as whole-batch numpy
  calls (the measurement that made the search's steps compiled);
- `playout_speed`: random playouts/s of the vectorised engine vs a pure-Python loop of
  `state.play`, and of open_spiel's connect_four when it is importable;
- `batch_start_up`: a batch of small games with a worker spawned for it vs a worker kept in a
  `selfplay_pool.WorkerPool` (the self-play daemon's way): wall and CPU seconds per batch.

Apart from the search's own figures (any game, bench_selfplay.py) because these are written
for Connect Four's modules and the node's process layout; run through bench_selfplay.py.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.config import Settings  # noqa: E402
from app.games import get_game  # noqa: E402
from app.games.connect4_playouts import random_playouts  # noqa: E402
from app.games.search.mcts import choose_action, temperature_for_ply  # noqa: E402
from app.games.search.model import new_model  # noqa: E402
from app.shared.process_group import network_device  # noqa: E402


def shared_network(arch, workers: int, seconds: float, concurrent: int, sims: int, device: str) -> dict:
    """`workers` self-play processes against one network server process (the stand-in for a
    GPU on a CPU node) for `seconds`: the server's evaluations/s, mean batch, each worker's
    share; beside it the raw network's rate at that mean batch, in the server's process kind
    (one torch thread)."""
    import multiprocessing as mp
    import tempfile

    from app.games.search.model import ModelMeta, save_model
    from app.games.search.network_server import NetworkServer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.safetensors"
        meta = save_model(new_model(arch, seed=0), ModelMeta(arch, "connect4"), path)
        server = NetworkServer(path, meta.sha256, "connect4", device)
        ctx = mp.get_context("spawn")
        done = ctx.Queue()
        procs = [ctx.Process(target=_server_worker, args=(server.address, server.authkey, f"worker-{i}", seconds,
                                                          concurrent, sims, done)) for i in range(workers)]
        for p in procs:
            p.start()
        reports = [done.get(timeout=seconds + 300) for _ in procs]
        for p in procs:
            p.join(30)
        stats = server.stats()
        server.close()
    busy = max(r["seconds"] for r in reports)
    mean_batch = stats["evaluations"] / max(1, stats["batches"])
    # the raw network at the server's mean batch, on the server's device, one torch thread
    net = new_model(arch, seed=0).to(network_device(device)).eval()
    game, rng = get_game("connect4"), random.Random(1)
    states = []
    while len(states) < max(1, round(mean_batch)):
        state = game.initial_state()
        for _ in range(rng.randrange(4, 12)):
            state = state.play(rng.choice(state.legal_moves()))
            if state.is_terminal:
                break
        if not state.is_terminal:
            states.append(state)
    from bench_selfplay import ceiling

    ceiling_rate = ceiling(net, states)
    return {
        "workers": workers, "concurrent_games_per_worker": concurrent, "simulations": sims,
        "server_evals_per_s": round(stats["evaluations"] / busy, 1),
        "server_mean_batch": round(mean_batch, 1),
        "ceiling_at_mean_batch": round(ceiling_rate, 1),
        "server_over_ceiling": round(stats["evaluations"] / busy / ceiling_rate, 3),
        "worker_shares": {name: round(n / max(1, stats["evaluations"]), 3) for name, n in sorted(stats["clients"].items())},
        "workers_sims_per_s": [r["sims_per_s"] for r in reports],
        "workers_positions_per_s": round(sum(r["positions_per_s"] for r in reports), 2),
    }


def _server_worker(address, authkey, name: str, seconds: float, concurrent: int, sims: int, done) -> None:
    torch.set_num_threads(1)
    from app.games.search.network_server import SharedNetworkClient
    from bench_selfplay import ForestGames

    game = get_game("connect4")
    client = SharedNetworkClient.connect(address, authkey, "connect4", name)
    settings = Settings()
    games = ForestGames(game, settings, concurrent)
    rng = np.random.default_rng(hash(name) % 2**32)
    plies = [0] * concurrent
    played = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for i, result in enumerate(games.search(client, sims, rng, True)):
            action = choose_action(result.visits, temperature_for_ply(plies[i], settings.search.temperature_moves), rng)
            plies[i] = 0 if games.play(i, action) else plies[i] + 1
            played += 1
    elapsed = time.perf_counter() - start
    client.close()
    done.put({"name": name, "seconds": elapsed, "sims_per_s": round(played * sims / elapsed, 1),
              "positions_per_s": round(played / elapsed, 2)})


def numpy_step_cost(concurrent: int, repeats: int = 300) -> dict:
    """Why the search's steps are compiled: what one level of a selection and one node's
    threat check cost as whole-batch numpy calls over `concurrent` trees (the numpy form a
    vectorised search would take: gather each tree's edge rows, PUCT, argmax, follow the
    child; the bitboard tests of `connect4.winning_cells` for both sides). A simulation
    descends several levels and creates a node, so numpy's per-call cost is paid ~10x a
    simulation, against ~3 us for the whole compiled simulation (`search_us_per_sim`)."""
    rng = np.random.default_rng(0)
    t, nodes, a = concurrent, 512, 7
    n = rng.integers(0, 20, (t, nodes, a)).astype(np.float64)
    w = rng.standard_normal((t, nodes, a))
    p = rng.random((t, nodes, a))
    child = rng.integers(0, nodes, (t, nodes, a))
    legal = rng.random((t, nodes, a)) < 0.9
    at = rng.integers(0, nodes, t)
    rows = np.arange(t)

    def select_level() -> np.ndarray:
        nn, ww, pp, ll = n[rows, at], w[rows, at], p[rows, at], legal[rows, at]
        total = np.where(ll, nn, 0.0).sum(axis=1, keepdims=True)
        q = np.divide(ww, nn, out=np.zeros_like(ww), where=nn > 0)
        score = np.where(ll, q + 1.5 * np.sqrt(total + 1.0) * pp / (1.0 + nn), -np.inf)
        return child[rows, at, score.argmax(axis=1)]

    from app.games.connect4_arrays import _BOARD, _BOTTOM_ROW

    position = rng.integers(0, 2**48, t, dtype=np.uint64) & _BOARD
    mask = position | (rng.integers(0, 2**48, t, dtype=np.uint64) & _BOARD)

    def winning_cells(stones: np.ndarray) -> np.ndarray:
        u = np.uint64
        cells = (stones << u(1)) & (stones << u(2)) & (stones << u(3))
        for shift in (u(7), u(6), u(8)):
            pair = (stones << shift) & (stones << (shift + shift))
            cells |= pair & (stones << (shift * u(3)))
            cells |= pair & (stones >> shift)
            pair = (stones >> shift) & (stones >> (shift + shift))
            cells |= pair & (stones << shift)
            cells |= pair & (stones >> (shift * u(3)))
        return cells & (_BOARD ^ mask)

    def threat_check() -> np.ndarray:
        playable = (mask + _BOTTOM_ROW) & _BOARD
        wins = winning_cells(position) & playable
        threats = winning_cells(position ^ mask)
        forced = playable & threats
        return np.where(forced != 0, forced, playable) & ~(threats >> np.uint64(1)) | wins

    out = {}
    for name, step in (("select_level_us", select_level), ("threat_check_us", threat_check)):
        step()
        start = time.perf_counter()
        for _ in range(repeats):
            step()
        out[name] = round((time.perf_counter() - start) / repeats * 1e6, 1)
    out["trees"] = t
    out["per_tree_per_simulation_us_at_depth_8"] = round((8 * out["select_level_us"] + out["threat_check_us"]) / t, 2)
    return out


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

    from app.games.train.selfplay import run_selfplay
    from app.games.train.selfplay_pool import WorkerPool

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
