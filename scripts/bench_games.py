"""Acceptance figures of issue #51's shipped games: does training through the one array search
make them play better? Prints one JSON object.

    python scripts/bench_games.py --game othello --iterations 8
    python scripts/bench_games.py --game mnk3 --iterations 8

A bounded AlphaZero loop on one process: self-play through `SearchForest` (the array search
compiled for the game) with the network in `NetworkEvaluator`, visit counts as the policy
target and each seat's result (the game's `returns()`, in the network's value convention) as
the value target, training on the recent window with the game's eight symmetries. The loop
is written here, not through the daemons' self-play/export/train, so that it measures the
games and the search alone (see docs/benchmarks/games.md for what was run).

- othello: the search's move (argmax visits, no noise) on positions with few empty cells,
  against the exact endgame search (`othello_solver`): the share that keeps the best
  win/draw/loss (`outcome`) and the share with the best disc margin (`exact`), for the
  untrained net and after each evaluated iteration, on the same positions.
- mnk3: the network with search in one seat against pure MCTS (uniform priors, random
  playouts) in the other two, the seat rotated; the agent's mean score (win 1, draw 1/3,
  loss 0: one third is par) untrained and trained.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.games.search.evaluators import NetworkEvaluator, RolloutEvaluator, UniformEvaluator  # noqa: E402
from app.games.search.model import Architecture, new_model  # noqa: E402
from app.games.search.search_forest import SearchForest  # noqa: E402
from app.config.pipeline import SearchConfig  # noqa: E402
from app.games import Game, GameState, get_game  # noqa: E402


def value_target(game: Game, returns: np.ndarray, mover: int) -> np.ndarray:
    """The network's value convention: the mover's return, or entry k for seat (mover + k) % N."""
    if game.value_size == 1:
        return np.array([returns[mover]], dtype=np.float32)
    n = game.num_players
    return np.array([returns[(mover + k) % n] for k in range(n)], dtype=np.float32)


def selfplay(game: Game, net, games: int, sims: int, cfg: SearchConfig, temperature_moves: int,
             rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """`games` games, all at once in one forest: (planes, policy target, value target) samples."""
    evaluator = NetworkEvaluator(net, game)
    forest = SearchForest.for_search(game, cfg, trees=games)
    slots = [forest.add(game.initial_state()) for _ in range(games)]
    history: dict[int, list[tuple[GameState, np.ndarray]]] = {s: [] for s in slots}
    samples = []
    live = list(slots)
    while live:
        results = forest.search(live, evaluator, sims, cfg, rng, add_noise=True)
        still = []
        for slot, result in zip(live, results):
            state = forest.root_state(slot)
            history[slot].append((state, result.visits))
            counts = np.asarray(result.counts, dtype=np.float64)
            if state.ply < temperature_moves:
                action = int(rng.choice(len(counts), p=counts / counts.sum()))
            else:
                action = int(np.argmax(counts))
            forest.advance(slot, action)
            after = forest.root_state(slot)
            if after.is_terminal:
                returns = after.returns()
                for s, policy in history[slot]:
                    samples.append((s.planes(), policy.astype(np.float32), value_target(game, returns, s.to_move)))
            else:
                still.append(slot)
        live = still
    return samples


def train(game: Game, net, samples, steps: int, batch: int, lr: float, rng: np.random.Generator) -> float:
    """`steps` Adam steps on random batches of the window, each sample in a random symmetry."""
    planes = np.stack([s[0] for s in samples])
    policies = np.stack([s[1] for s in samples])
    values = np.stack([s[2] for s in samples])
    perms = game.symmetry_permutations()
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=1e-4)
    net.train()
    loss_sum = 0.0
    for _ in range(steps):
        idx = rng.integers(0, len(samples), size=batch)
        cells, actions = perms[int(rng.integers(len(perms)))]
        c, h, w = game.plane_shape
        x = planes[idx].reshape(batch, c, h * w)[..., cells].reshape(batch, c, h, w)
        p = policies[idx][:, actions]
        logits, v = net(torch.from_numpy(np.ascontiguousarray(x)))
        v = v.reshape(batch, -1)
        loss = (-(torch.from_numpy(np.ascontiguousarray(p)) * torch.log_softmax(logits, -1)).sum(-1).mean()
                + ((v - torch.from_numpy(values[idx])) ** 2).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss_sum += float(loss.detach())
    net.eval()
    return loss_sum / max(steps, 1)


def search_moves(game: Game, evaluator, states: list[GameState], sims: int, cfg: SearchConfig,
                 rng: np.random.Generator) -> list[int]:
    """The search's move (most visits, no noise) in each position, all searched at once."""
    forest = SearchForest.for_search(game, cfg, trees=len(states))
    slots = [forest.add(s) for s in states]
    results = forest.search(slots, evaluator, sims, cfg, rng)
    return [int(np.argmax(r.counts)) for r in results]


# -- othello: agreement with the exact endgame search ---------------------------------------


def endgame_positions(game: Game, count: int, empties: int, seed: int):
    """Positions of seeded random games at `empties` empty cells where the choice matters
    (not every move keeps the best result), with their exact move sets."""
    from app.games.othello_solver import EndgameSolver

    solver = EndgameSolver()
    rng = random.Random(seed)
    out = []
    while len(out) < count:
        state = game.initial_state()
        while not state.is_terminal and 36 - (state.own | state.opp).bit_count() > empties:
            state = state.play(rng.choice(state.legal_moves()))
        if state.is_terminal or len(state.legal_moves()) < 2:
            continue
        outcome = solver.outcome_moves(state)
        if len(outcome) == len(state.legal_moves()):
            continue
        out.append((state, set(outcome), set(solver.best_moves(state))))
    return out


def othello_agreement(game, evaluator, positions, sims, cfg, rng) -> dict:
    moves = search_moves(game, evaluator, [p[0] for p in positions], sims, cfg, rng)
    outcome = float(np.mean([m in p[1] for m, p in zip(moves, positions)]))
    exact = float(np.mean([m in p[2] for m, p in zip(moves, positions)]))
    return {"outcome": round(outcome, 3), "exact": round(exact, 3)}


# -- mnk3: the agent against pure MCTS -------------------------------------------------------


def mnk3_score(game, agent, agent_sims, opponent, opponent_sims, games_per_seat, cfg, rng) -> dict:
    """The agent's mean score (win 1, draw 1/3, loss 0) per seat, two pure MCTS opponents."""
    per_seat = {}
    for seat in range(game.num_players):
        scores = []
        # All games of this seat at once: one forest for the agent's trees, one for the MCTS's.
        states = [game.initial_state() for _ in range(games_per_seat)]
        while any(not s.is_terminal for s in states):
            live = [i for i, s in enumerate(states) if not s.is_terminal]
            mine = [i for i in live if states[i].to_move == seat]
            theirs = [i for i in live if states[i].to_move != seat]
            for group, ev, sims in ((mine, agent, agent_sims), (theirs, opponent, opponent_sims)):
                if group:
                    moves = search_moves(game, ev, [states[i] for i in group], sims, cfg, rng)
                    for i, m in zip(group, moves):
                        states[i] = states[i].play(m)
        for s in states:
            scores.append(1.0 / 3 if s.winner is None else float(s.winner == seat))
        per_seat[seat] = round(float(np.mean(scores)), 3)
    return {"per_seat": per_seat, "mean": round(float(np.mean(list(per_seat.values()))), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--game", choices=["othello", "mnk3"], required=True)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--games", type=int, default=64, help="self-play games an iteration")
    ap.add_argument("--sims", type=int, default=64, help="simulations a self-play move")
    ap.add_argument("--train-steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--window", type=int, default=4, help="iterations of samples trained on")
    ap.add_argument("--channels", type=int, default=32)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--eval-every", type=int, default=4)
    ap.add_argument("--eval-sims", type=int, default=64)
    ap.add_argument("--positions", type=int, default=200, help="othello: endgame positions")
    ap.add_argument("--empties", type=int, default=10, help="othello: empty cells of a position")
    ap.add_argument("--eval-games", type=int, default=30, help="mnk3: games a seat")
    ap.add_argument("--mcts-sims", type=int, default=400, help="mnk3: pure MCTS simulations a move")
    ap.add_argument("--mcts-rollouts", type=int, default=4, help="mnk3: random playouts a leaf")
    ap.add_argument("--mcts-reference", action="store_true",
                    help="mnk3: also score pure MCTS itself in the agent's seat (par for the method)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    game = get_game(args.game)
    cfg = SearchConfig(length_discount=0.0, threat_check=False, dirichlet_alpha=0.5)
    net = new_model(Architecture.for_game(game, args.channels, args.blocks), seed=args.seed)
    net.eval()
    started = time.time()
    if args.game == "othello":
        positions = endgame_positions(game, args.positions, args.empties, args.seed + 1)

        def evaluate() -> dict:
            return othello_agreement(game, NetworkEvaluator(net, game), positions, args.eval_sims, cfg, rng)

        reference = {"uniform_search": othello_agreement(game, UniformEvaluator(game), positions, args.eval_sims,
                                                         cfg, rng),
                     "playout_search": othello_agreement(game, RolloutEvaluator(game, 4, rng), positions,
                                                         args.eval_sims, cfg, rng)}
    else:
        opponent = RolloutEvaluator(game, args.mcts_rollouts, rng)

        def evaluate() -> dict:
            return mnk3_score(game, NetworkEvaluator(net, game), args.eval_sims, opponent, args.mcts_sims,
                              args.eval_games, cfg, rng)

        reference = {}
        if args.mcts_reference:
            reference["pure_mcts_as_agent"] = mnk3_score(game, RolloutEvaluator(game, args.mcts_rollouts, rng),
                                                         args.mcts_sims, opponent, args.mcts_sims, args.eval_games,
                                                         cfg, rng)
    curve = [{"iteration": 0, "samples": 0, **evaluate(), "seconds": round(time.time() - started)}]
    print(json.dumps(curve[-1]), file=sys.stderr, flush=True)
    window: list[list] = []
    for it in range(1, args.iterations + 1):
        window.append(selfplay(game, net, args.games, args.sims, cfg, temperature_moves=8, rng=rng))
        window = window[-args.window:]
        samples = [s for chunk in window for s in chunk]
        loss = train(game, net, samples, args.train_steps, args.batch, args.lr, rng)
        row = {"iteration": it, "samples": len(samples), "loss": round(loss, 3)}
        if it % args.eval_every == 0 or it == args.iterations:
            row.update(evaluate())
        row["seconds"] = round(time.time() - started)
        curve.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    print(json.dumps({"game": args.game, "args": vars(args), "reference": reference, "curve": curve}))


if __name__ == "__main__":
    main()
