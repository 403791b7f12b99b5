"""Self-play speed, measured side by side in one run; prints ONE JSON object.

- ceiling: raw network evaluations per second at the search's batch size (no search),
  best of short windows taken before and after the search runs;
- MCTS self-play with the default net: simulations/s, network evaluations/s and positions
  (moves played)/s over `--concurrent` games at once, and their ratio to the ceiling (the
  share of the network's throughput the search keeps; aim >= 0.95 at 64 games), also
  against the network's own rate on the batches of the run (`sims_over_network_in_run`: the
  forward passes are timed inside the run, so a shared machine's drift cancels out);
- the search's own cost: microseconds a simulation with a free evaluator (one that answers
  from a preallocated array, so only the search is timed), with and without the threat check
  (`search.threat_check`; aim <= 5 us with it, on one core);
- (the per-tree search this replaced was measured beside it by the same script with
  `--legacy` until its removal: docs/benchmarks/search_arrays.md);
- what a leaf's network input costs, one state at a time against the game's batch form;
- around the search, for the default game (bench_selfplay_engine.py): whole-batch numpy steps
  (why the search is compiled), the shared network server (`--server-workers N`), random
  playouts/s of the bitboard engine, and a batch's worker spawned vs kept in a pool.

- with `--game G` (any game `node.game` takes: a registered name or "pkg.module:Class"): the
  search's cost a simulation and its share of the network for that game, and the first-run
  compile time of the game's search kernel (a fresh kernel cache directory) against its
  cached start, each in a new process; the parts around the search (bench_selfplay_engine.py)
  run for the default game only.

    python scripts/bench_selfplay.py [--game G] [--concurrent 64] [--sims 64] [--moves 6] [--device cuda]
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from app.games.search.evaluators import NetworkEvaluator  # noqa: E402
from app.games.search.mcts import SearchForest, choose_action, temperature_for_ply  # noqa: E402
from app.games.search.model import Architecture, new_model, predict  # noqa: E402
from app.config import Settings  # noqa: E402
from app.games import get_game  # noqa: E402
from app.log import configure_logging  # noqa: E402
from app.shared.process_group import DEVICE_CHOICES, network_device  # noqa: E402
from bench_selfplay_engine import batch_start_up, numpy_step_cost, playout_speed, shared_network  # noqa: E402


def ceiling(net, states, windows: int = 3, seconds: float = 1.0) -> float:
    """Best rate over several short windows: on a shared machine the best window is the
    closest to the hardware's ceiling, which keeps the search's ratio conservative."""
    return ceiling_rates(net, states, windows, seconds)["wall"]


def ceiling_rates(net, states, windows: int = 3, seconds: float = 1.0) -> dict:
    """The raw network's evaluations a second, best of several windows, by the wall clock and
    by this thread's CPU time (the search's ratio by CPU time is what other processes on a
    shared machine cannot move: the network and the search run on this one thread)."""
    planes = np.stack([s.planes() for s in states])
    legal = np.stack([s.legal_mask() for s in states])
    predict(net, planes, legal)  # warm-up
    best = {"wall": 0.0, "cpu": 0.0}
    for _ in range(windows):
        n, start, cpu = 0, time.perf_counter(), time.thread_time()
        while time.perf_counter() - start < seconds:
            predict(net, planes, legal)
            n += len(states)
        best["wall"] = max(best["wall"], n / (time.perf_counter() - start))
        best["cpu"] = max(best["cpu"], n / max(1e-9, time.thread_time() - cpu))
    return best


def leaf_input_us(game, states, repeats: int = 200) -> dict:
    """What making the network's input costs a leaf, side by side: one state at a time
    (`planes()`, `legal_mask()`) against the game's batch form (`words_planes`,
    `words_legal_masks` of the words the search gathers, what NetworkEvaluator uses)."""
    def per_state() -> None:
        np.stack([s.planes() for s in states]), np.stack([s.legal_mask() for s in states])

    words = game.state_words(states)  # what the search hands the evaluator

    def stacked() -> None:
        game.words_planes(words), game.words_legal_masks(words)

    times = {}
    for name, make in (("per_state", per_state), ("stacked", stacked), ("per_state_again", per_state)):
        make()
        start = time.perf_counter()
        for _ in range(repeats):
            make()
        times[name] = (time.perf_counter() - start) / repeats / len(states) * 1e6
    return {"per_state_us": round(min(times["per_state"], times["per_state_again"]), 2),
            "stacked_us": round(times["stacked"], 2)}


class FreeEvaluator:
    """Uniform priors over all moves (the search renormalises them over the legal ones) and
    value 0, from a preallocated array: an evaluator that costs nothing, so a run with it times
    the search alone."""

    def __init__(self, game) -> None:
        self.game = game
        self.positions = 0
        self._priors = np.full((1, game.num_actions), 1.0 / game.num_actions)
        self._values = self._zeros(1)

    def _zeros(self, n: int) -> np.ndarray:
        """Values shaped as the game's network answers: (n,) or (n, N) for N > 2 seats."""
        return np.zeros(n if self.game.value_size == 1 else (n, self.game.value_size))

    def evaluate_batch(self, words):
        return self._answer(len(words))

    def _answer(self, n: int):
        if n > len(self._values):
            self._priors = np.full((2 * n, self._priors.shape[1]), self._priors[0, 0])
            self._values = self._zeros(2 * n)
        self.positions += n
        return self._priors[:n], self._values[:n]


class TimedNetworkEvaluator(NetworkEvaluator):
    """NetworkEvaluator that also sums the seconds spent in the network's forward pass
    (`predict`), so a run knows the raw network's rate on the very batches the search made:
    the same net, batches and thread, whatever else the machine was doing meanwhile."""

    network_seconds = 0.0

    def evaluate_batch(self, words):
        planes, legal = self.game.words_planes(words), self.game.words_legal_masks(words)
        start = time.perf_counter()
        answer = predict(self.net, planes, legal)
        self.network_seconds += time.perf_counter() - start
        self.positions += len(words)
        self.batches += 1
        return answer


class ForestGames:
    """`concurrent` self-play games on the array search (what selfplay_games.play_games does)."""

    def __init__(self, game, settings: Settings, concurrent: int) -> None:
        self.game, self.settings = game, settings
        self.forest = SearchForest.for_search(game, settings.search, trees=concurrent)
        self.slots = [self.forest.add(game.initial_state()) for _ in range(concurrent)]

    def search(self, evaluator, sims: int, rng, noise: bool):
        return self.forest.search(self.slots, evaluator, sims, self.settings.search, rng, add_noise=noise)

    def play(self, i: int, action: int) -> bool:
        """Play a move in game i; True when that game ended (and a new one took its slot)."""
        self.forest.advance(self.slots[i], action)
        if self.forest.root_state(self.slots[i]).is_terminal:
            self.forest.reset(self.slots[i], self.game.initial_state())
            return True
        return False


def selfplay_speed(games_cls, game, evaluator, concurrent: int, sims: int, moves: int, settings: Settings,
                   seed: int) -> dict:
    """Play `moves` plies in each of `concurrent` games (finished games restart), with root
    noise and the temperature schedule, as self-play does."""
    rng = np.random.default_rng(seed)
    games = games_cls(game, settings, concurrent)
    plies = [0] * concurrent
    games.search(evaluator, 1, rng, False)  # expand roots (and load the compiled kernel) outside the timing
    evals_before = evaluator.positions
    network_before = getattr(evaluator, "network_seconds", 0.0)
    played = 0
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(moves):
        results = games.search(evaluator, sims, rng, True)
        for i, result in enumerate(results):
            action = choose_action(result.visits, temperature_for_ply(plies[i], settings.search.temperature_moves), rng)
            plies[i] = 0 if games.play(i, action) else plies[i] + 1
            played += 1
    seconds, cpu_seconds = time.perf_counter() - start, time.thread_time() - cpu
    network = getattr(evaluator, "network_seconds", 0.0) - network_before
    evals = evaluator.positions - evals_before
    inrun = {}
    if network > 0:  # simulations/s over the network's own evaluations/s on these batches
        inrun = {"network_seconds": round(network, 3),
                 "sims_over_network_in_run": round((played * sims / seconds) / (evals / network), 4)}
    return {
        **inrun,
        "sims_per_s": round(played * sims / seconds, 1),
        "sims_per_cpu_s": round(played * sims / cpu_seconds, 1),
        "evals_per_s": round((evaluator.positions - evals_before) / seconds, 1),
        "positions_per_s": round(played / seconds, 2),
        "seconds": round(seconds, 2),
    }


def paired_slices(net, states, game, evaluator, settings: Settings, concurrent: int, sims: int,
                  slices: int) -> dict:
    """The search's share of the network, robust to a shared machine: each slice is a 1 s
    window of the raw network, one move of every game, another window; a slice's ratio sees
    the same load, and the median over slices is reported (the slower window of each pair is
    dropped: conservative)."""
    kinds = [("search", ForestGames(game, settings, concurrent))]
    rngs = {name: np.random.default_rng(1) for name, _ in kinds}
    plies = {name: [0] * concurrent for name, _ in kinds}
    for name, games in kinds:
        games.search(evaluator, 1, rngs[name], False)  # roots expanded outside the timing
    ratio: dict = {name: [] for name, _ in kinds}
    positions: dict = {name: [] for name, _ in kinds}
    for _ in range(slices):
        before = ceiling_rates(net, states, windows=1)["wall"]
        rates = {}
        for name, games in kinds:
            rng = rngs[name]
            start = time.perf_counter()
            results = games.search(evaluator, sims, rng, True)
            for i, result in enumerate(results):
                t = temperature_for_ply(plies[name][i], settings.search.temperature_moves)
                plies[name][i] = 0 if games.play(i, choose_action(result.visits, t, rng)) else plies[name][i] + 1
            seconds = time.perf_counter() - start
            rates[name] = concurrent * sims / seconds
            positions[name].append(concurrent / seconds)
        top = max(before, ceiling_rates(net, states, windows=1)["wall"])
        for name in rates:
            ratio[name].append(rates[name] / top)
    return {"sims_over_ceiling_median": round(float(np.median(ratio["search"])), 3),
            "sims_over_ceiling_per_slice": [round(r, 3) for r in ratio["search"]],
            "positions_per_s_median": round(float(np.median(positions["search"])), 2)}


def search_cost(games_cls, game, concurrent: int, sims: int, moves: int, settings: Settings) -> dict:
    """The search's own cost: microseconds a simulation with the free evaluator, with and
    without the threat check (best of two runs each: the machine is shared)."""
    plain = settings.model_copy(update={"search": settings.search.model_copy(update={"threat_check": False})})
    out = {}
    for name, cfg in (("us_per_sim", settings), ("us_per_sim_without_threat_check", plain)):
        runs = [selfplay_speed(games_cls, game, FreeEvaluator(game), concurrent, sims, moves, cfg, 2) for _ in range(2)]
        out[name] = round(1e6 / max(r["sims_per_s"] for r in runs), 2)
    return out


def kernel_start_up(game_name: str) -> dict:
    """Seconds from a new process's first `get_game` to its first search of one simulation:
    with an empty kernel cache (numba compiles the game's kernel) and again with that cache."""
    import os
    import subprocess
    import tempfile

    code = ("import time; t = time.perf_counter(); import numpy as np; from app.games import get_game; "
            "from app.games.search.mcts import SearchForest; from app.games.search.evaluators import UniformEvaluator; "
            "from app.config import SearchConfig; g = get_game(%r); c = SearchConfig(); "
            "f = SearchForest.for_search(g, c); s = f.add(g.initial_state()); "
            "f.search([s], UniformEvaluator(g), 1, c, np.random.default_rng(0)); "
            "print(time.perf_counter() - t)") % game_name
    root = Path(__file__).resolve().parent.parent
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "SELFPLAY_KERNEL_DIR": tmp}
        for name in ("first_run", "cached_start"):
            before = os.times()
            run = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                                 check=True)
            after = os.times()
            out[f"{name}_s"] = round(float(run.stdout.strip().splitlines()[-1]), 2)
            # the child's CPU seconds: what a shared machine's load does not inflate
            out[f"{name}_cpu_s"] = round(after.children_user - before.children_user
                                         + after.children_system - before.children_system, 2)
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
    ap.add_argument("--server-workers", type=int, default=2,
                    help="search processes sharing one network server process (0: skip that part)")
    ap.add_argument("--server-seconds", type=float, default=20.0)
    ap.add_argument("--slices", type=int, default=8, help="paired slices (a network window, a move of every game)")
    ap.add_argument("--game", default=None, help="the game (node.game's forms); default: the config's")
    args = ap.parse_args()
    configure_logging()  # the self-play runs below log; stdout carries only the one JSON object
    torch.set_num_threads(1)
    settings = Settings()
    game = get_game(args.game or settings.node.game)
    default_game = game.name == settings.node.game
    arch = Architecture.for_game(game, args.channels or settings.model.channels, args.blocks or settings.model.blocks)
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
    evaluator = TimedNetworkEvaluator(net, game)
    ceilings = [ceiling_rates(net, states)]
    net_play = selfplay_speed(ForestGames, game, evaluator, args.concurrent, args.sims, args.moves, settings, 1)
    ceilings.append(ceiling_rates(net, states))  # measured on both sides of each search run: the machine is shared
    ceiling_rate = max(c["wall"] for c in ceilings)
    ceiling_cpu = max(c["cpu"] for c in ceilings)
    paired = paired_slices(net, states, game, evaluator, settings, args.concurrent, args.sims, args.slices)
    cost = search_cost(ForestGames, game, args.concurrent, args.sims, args.moves * 3, settings)
    server = (shared_network(arch, args.server_workers, args.server_seconds, args.concurrent, args.sims, str(device))
              if args.server_workers and default_game else None)
    playouts = playout_speed(args.playout_batch, repeats=5) if default_game else None
    numpy_steps = numpy_step_cost(args.concurrent) if default_game else None
    start_up = batch_start_up(args.batches, games=8, sims=4) if args.batches and default_game else None
    print(json.dumps({
        "game": game.name,
        "kernel_start_up": kernel_start_up(game.name),
        "machine": {"cpu": platform.processor() or platform.machine(), "torch": torch.__version__,
                    "torch_threads": torch.get_num_threads()},
        "net": {"channels": arch.channels, "blocks": arch.blocks, "device": str(device)},
        "concurrent_games": args.concurrent,
        "simulations": args.sims,
        "ceiling_net_evals_per_s": round(ceiling_rate, 1),
        "ceiling_windows": [round(c["wall"], 1) for c in ceilings],
        "ceiling_net_evals_per_cpu_s": round(ceiling_cpu, 1),
        "mcts_network": net_play,
        "mcts_sims_over_ceiling": round(net_play["sims_per_s"] / ceiling_rate, 3),
        "mcts_evals_over_ceiling": round(net_play["evals_per_s"] / ceiling_rate, 3),
        # the same by this thread's CPU seconds (search and network share the thread): the ratio
        # other processes on a shared machine do not move; on a GPU the wall ratio is the one
        "mcts_sims_over_ceiling_cpu": round(net_play["sims_per_cpu_s"] / ceiling_cpu, 3),
        # the search's own cost a simulation, free evaluator, one core: what the ratio loses
        "search_us_per_sim": cost["us_per_sim"],
        "search_us_per_sim_without_threat_check": cost["us_per_sim_without_threat_check"],
        # the ratio again, slice by slice beside the network (the figure to quote on a shared machine)
        "paired_slices": paired,
        "numpy_search_steps": numpy_steps,
        "shared_network": server,
        "leaf_input_us": leaf_input_us(game, states),
        "random_playouts": playouts,
        "batch_start_up": start_up,
    }))


if __name__ == "__main__":
    main()
