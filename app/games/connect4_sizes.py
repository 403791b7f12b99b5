"""Connect Four at any width x height that fits the bitboard: (height + 1) * width <= 64
bits, width <= 9 (a move is one digit), four in a row possible (width or height >= 4).

The default game's modules (`connect4_arrays`, `connect4_bits`, `connect4`, `connect4_rules`,
`connect4_heuristic`, `connect4_playouts`) read the size from `connect4_arrays.WIDTH` /
`HEIGHT`; numba freezes a module's globals when it compiles, so another size is the same
sources with those two lines changed, written as a family of modules under the generated
directory (`array_rules.generated_dir`, named by the size and a hash of the sources) and
imported from there: every process that asks `get_game("connect4_8x7")` gets the same
modules, compiled once and cached on disk like the search kernel.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

from app.games.array_rules import source_digest, write_module
from app.games.base import Game, GameError

MEMBERS = ("connect4_arrays", "connect4_bits", "connect4", "connect4_rules", "connect4_heuristic", "connect4_playouts")
SIZED_NAME = re.compile(r"^connect4_(\d+)x(\d+)$")
_HERE = Path(__file__).resolve().parent


def size_problem(width: int, height: int) -> str | None:
    if not 1 <= width <= 9 or height < 1:
        return f"width must be 1..9 (a move is one digit) and height >= 1, got {width}x{height}"
    if (height + 1) * width > 64:
        return f"{width}x{height} needs {(height + 1) * width} bits; the bitboard has 64"
    if width < 4 and height < 4:
        return f"{width}x{height} has no room for four in a row"
    return None


def sized_connect4(width: int, height: int) -> Game:
    """Connect Four on a width x height board, named `connect4_<w>x<h>`; GameError for a
    size that does not fit."""
    problem = size_problem(width, height)
    if problem is not None:
        raise GameError(f"node.game: connect4_{width}x{height}: {problem}")
    sources = {m: (_HERE / f"{m}.py").read_text() for m in MEMBERS}
    prefix = f"c4_{width}x{height}_{source_digest(*sources.values())}"
    for member, text in sources.items():
        for other in MEMBERS:
            text = text.replace(f"from app.games import {other}\n", f"import {prefix}_{other} as {other}\n")
            text = text.replace(f"from app.games import {other} as ", f"import {prefix}_{other} as ")
            text = text.replace(f"from app.games.{other} import", f"from {prefix}_{other} import")
            text = text.replace(f'"app.games.{other}"', f'"{prefix}_{other}"')
        if member == "connect4_arrays":
            text = re.sub(r"^WIDTH = 7\b.*$", f"WIDTH = {width}", text, count=1, flags=re.M)
            text = re.sub(r"^HEIGHT = 6\b.*$", f"HEIGHT = {height}", text, count=1, flags=re.M)
        if member == "connect4":
            text = text.replace('    name = "connect4"\n', f'    name = "connect4_{width}x{height}"\n')
            text = re.sub(r'^    scored_positions = .*$', "    scored_positions = None  # solved only at 7x6", text,
                          count=1, flags=re.M)
        write_module(f"{prefix}_{member}", text)
    module = importlib.import_module(f"{prefix}_connect4")
    return module.Connect4()
