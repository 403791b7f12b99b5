"""A user's window into a model: analyse positions read from stdin, one JSON line each.

    echo 4453 | python -m app.analyze --model data/models/best.safetensors --sims 200

Input: one position per line as a move string in the model's game's own notation
(`Game.parse`; the default game: Pascal Pons' digits 1-7, the first column is 1); an empty
line is the starting position. Output,
one line per input line, written and flushed as soon as the line is read, so another program
can drive this like an engine over a pipe:

    {"moves": "4453", "policy": [7 floats], "value": 0.12, "best_move": 4,
     "net_policy": [7 floats], "net_value": -0.05, "net_best_move": 3}

Moves are written as in the input, everywhere (`Game.action_to_text`, a number where the
notation is one: 1-7 for the default game's columns). `best_move`, `net_best_move` and
`unsafe_moves` are such moves; `policy` and `net_policy` list one probability per action, in
action order. `value` is from the side to move's view in [-1, 1];
`policy` is the search's visit distribution, or with `--sims 0` the raw network's
probabilities (and `value` the network's). `net_policy`, `net_value` and `net_best_move`
are always the raw network's own view of the position, so a user sees beside the search's
choice what the network alone would have played and why the search disagreed. `proven` is
the position's exact value when the search solved it (null otherwise), and `unsafe_moves` the
columns after which the opponent wins on the spot (the search's threat check never searches
them, `search.threat_check`). A line that is not a legal, unfinished position
gets `{"moves": "...", "error": "..."}` and the run goes on. This format is a stable
interface: add keys if needed, never rename or remove them.

Exit status: 0 at end of input, 2 when the model cannot be loaded.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from app.games.search.evaluators import NetworkEvaluator
from app.games.search.mcts import SearchResult, search
from app.games.search.model import ModelFormatError, load_model
from app.config import ConfigError, load_settings
from app.config.pipeline import SearchConfig
from app.games import Game, GameError, get_game

LEAVES_PER_ROUND = 8  # one tree, so batch several leaves per evaluator call (virtual loss)


def analyse_line(line: str, game: Game, evaluator: NetworkEvaluator, simulations: int,
                 cfg: SearchConfig, rng: np.random.Generator) -> dict:
    """The JSON answer for one input line (an "error" answer for a bad one)."""
    moves = line.strip()
    try:
        state = game.parse(moves)
    except GameError as exc:
        return {"moves": moves, "error": str(exc)}
    if state.is_terminal:
        outcome = "a draw" if state.winner is None else f"won by player {state.winner + 1}"
        return {"moves": moves, "error": f"the game is over ({outcome}): nothing to analyse"}
    priors, values = evaluator.evaluate([state])
    net_policy, net_value = priors[0], float(np.ravel(values[0])[0])  # the mover's entry
    net_best = int(np.argmax(net_policy))
    proven = None
    if simulations == 0:
        policy, value, best = net_policy, net_value, net_best
    else:
        result: SearchResult = search(state, evaluator, simulations, cfg, rng,
                                      leaves_per_round=min(LEAVES_PER_ROUND, simulations), game=game)
        policy, value, best, proven = result.visits, result.root_value, result.best_action, result.proven
    safe = state.safe_moves()
    column = lambda action: move_number(game, action)  # noqa: E731
    return {
        "moves": moves,
        "policy": [round(float(p), 6) for p in policy],
        "value": round(value, 6),
        "best_move": column(best),
        "net_policy": [round(float(p), 6) for p in net_policy],
        "net_value": round(net_value, 6),
        "net_best_move": column(net_best),
        "proven": None if proven is None else round(proven, 6),
        "unsafe_moves": [column(a) for a in state.legal_moves() if a not in safe],
    }


def move_number(game: Game, action: int) -> int | str:
    """An action as the input writes it (`Game.action_to_text`), a number where the notation
    is one: a user reads one numbering in and out."""
    text = game.action_to_text(action)
    return int(text) if text.isdigit() else text


def serve(inp: TextIO, out: TextIO, game: Game, evaluator: NetworkEvaluator, simulations: int,
          cfg: SearchConfig, rng: np.random.Generator) -> int:
    """Answer each line of `inp` on `out` as soon as it is read; returns lines answered."""
    answered = 0
    while True:
        line = inp.readline()
        if not line:
            return answered
        try:
            answer = analyse_line(line, game, evaluator, simulations, cfg, rng)
        except Exception as exc:  # noqa: BLE001 - one bad position must not end the session
            answer = {"moves": line.strip(), "error": f"internal error: {type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()
        answered += 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m app.analyze", description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="model .safetensors (with its .json sidecar)")
    ap.add_argument("--sims", type=int, default=None,
                    help="search simulations per position; 0 = raw network (default: config search.simulations)")
    ap.add_argument("--config", type=Path, default=None, help="node config YAML (search settings)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.sims is not None and args.sims < 0:
        ap.error("--sims must be >= 0")
    torch.set_num_threads(1)
    try:
        settings = load_settings(args.config)
        net, meta = load_model(args.model)
        game = get_game(meta.game)  # the model's own game, whatever the config's node.game
    except (ModelFormatError, ConfigError, GameError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    sims = settings.search.simulations if args.sims is None else args.sims
    try:
        serve(sys.stdin, sys.stdout, game, NetworkEvaluator(net, game), sims, settings.search,
              np.random.default_rng(args.seed))
    except (BrokenPipeError, KeyboardInterrupt):
        return 0  # the reader went away or the user stopped us: nothing left to answer
    return 0


if __name__ == "__main__":
    sys.exit(main())
