"""One array search per game: app/games/search/search_kernel.py compiled against the game's node rules.

numba compiles a function against the globals of its module, so each game gets a module of
its own: the kernel's source with its RULES line bound to `import <Game.rules_module> as
rules`, written once under the kernel cache directory and imported from there. numba caches
the compiled functions beside that file (`cache=True`), so a new worker process loads them
instead of compiling. The file's name carries a hash of the kernel's source and of the rules
module's source: an edit of either gives a new file and a fresh compile (numba alone would
keep a stale cache when only the rules changed).

Where: `SELFPLAY_KERNEL_DIR`, else `$XDG_CACHE_HOME/selfplay-mesh/kernels` (~/.cache by
default). Writes are a temp name and a rename: concurrent workers never see half a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from app.games import Game
from app.games.array_rules import load_rules, write_module

TEMPLATE = Path(__file__).with_name("search_kernel.py")
RULES_LINE = "rules = None  # RULES: kernel_build writes `import <the game's rules module> as rules` here\n"
_LOADED: dict[str, ModuleType] = {}


def kernel_source(rules_module: str) -> str:
    template = TEMPLATE.read_text()
    if RULES_LINE not in template:
        raise RuntimeError(f"{TEMPLATE} lost its RULES line")
    return template.replace(RULES_LINE, f"import {rules_module} as rules\n", 1)


def kernel_for(game: Game) -> ModuleType:
    """The compiled search of `game` (a module with search_kernel.py's functions and
    constants), built on first use and cached on disk."""
    path = game.rules_module
    if path in _LOADED:
        return _LOADED[path]
    rules = load_rules(path)
    source = kernel_source(path)
    digest = hashlib.sha256(source.encode() + b"\0" + inspect.getsource(rules).encode()).hexdigest()[:16]
    name = f"search_kernel_{path.replace('.', '_')}_{digest}"
    target = write_module(name, source)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[path] = module
    return module
