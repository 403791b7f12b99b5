"""Compiled code per game: a template (search_kernel.py, the array search; playout_kernel.py,
random playouts) bound to the game's node rules.

numba compiles a function against the globals of its module, so each game gets a module of
its own per template: the template's source with its RULES line bound to `import
<Game.rules_module> as rules`, written once under the kernel cache directory and imported from
there. numba caches the compiled functions beside that file (`cache=True`), so a new worker
process loads them instead of compiling. The file's name carries a hash of the template's
source and of the rules module's source: an edit of either gives a new file and a fresh
compile (numba alone would keep a stale cache when only the rules changed).

Old keys are pruned: when a game's module is (re)written, the same template and game's files
under other hashes that no process has loaded for `PRUNE_AFTER_S` go, with numba's cache
files of them (each load refreshes its file's time). A recent old key stays: another version
of this program on the machine may still be using it.

Where: `SELFPLAY_KERNEL_DIR`, else `$XDG_CACHE_HOME/selfplay-mesh/kernels` (~/.cache by
default). Writes are a temp name and a rename: concurrent workers never see half a file.
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import os
import sys
import time
from pathlib import Path
from string import hexdigits
from types import ModuleType

from app.games import Game
from app.games.array_rules import load_rules, write_module

HERE = Path(__file__).resolve().parent
SEARCH_TEMPLATE = HERE / "search_kernel.py"
PLAYOUT_TEMPLATE = HERE / "playout_kernel.py"
RULES_LINE = "rules = None  # RULES: kernel_build writes `import <the game's rules module> as rules` here\n"
PRUNE_AFTER_S = 7 * 24 * 3600.0
_LOADED: dict[tuple[str, str], ModuleType] = {}


def template_source(template: Path, rules_module: str) -> str:
    text = template.read_text()
    if RULES_LINE not in text:
        raise RuntimeError(f"{template} lost its RULES line")
    return text.replace(RULES_LINE, f"import {rules_module} as rules\n", 1)


def kernel_for(game: Game) -> ModuleType:
    """The compiled search of `game` (a module with search_kernel.py's functions and
    constants), built on first use and cached on disk."""
    return compiled_for(SEARCH_TEMPLATE, game)


def playouts_for(game: Game) -> ModuleType:
    """The compiled random playouts of `game` (playout_kernel.py's `playout_values`)."""
    return compiled_for(PLAYOUT_TEMPLATE, game)


def compiled_for(template: Path, game: Game) -> ModuleType:
    path = game.rules_module
    key = (template.stem, path)
    if key in _LOADED:
        return _LOADED[key]
    rules = load_rules(path)
    source = template_source(template, path)
    digest = hashlib.sha256(source.encode() + b"\0" + inspect.getsource(rules).encode()).hexdigest()[:16]
    prefix = f"{template.stem}_{path.replace('.', '_')}_"
    name = prefix + digest
    target = write_module(name, source)
    try:
        os.utime(target)  # loaded now: what the pruning of other processes reads
    except FileNotFoundError:  # pruned by an older program's process this instant
        target = write_module(name, source)
    prune_old(target.parent, prefix, name)
    spec = importlib.util.spec_from_file_location(name, target)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _LOADED[key] = module
    return module


def prune_old(directory: Path, prefix: str, keep: str, older_than_s: float = PRUNE_AFTER_S) -> list[str]:
    """Remove `prefix`* modules other than `keep` unused for `older_than_s`, and numba's cache
    files of them (`__pycache__/<name>.*`); returns the names removed. A file another process
    removes first, or one it is writing, is no error."""
    removed = []
    cutoff = time.time() - older_than_s
    for file in directory.glob(f"{prefix}*.py"):
        name = file.stem
        digest = name[len(prefix):]
        if name == keep or len(digest) != 16 or not all(c in hexdigits for c in digest):
            continue  # this key, or another game whose module name extends this one's
        try:
            if file.stat().st_mtime > cutoff:
                continue
            file.unlink()
        except FileNotFoundError:
            continue
        for cached in [*(directory / "__pycache__").glob(f"{name}.*"), directory / f"{name}.compiled",
                       directory / f"{name}.lock"]:  # numba's cache, kernel_warm's marker and lock
            try:
                cached.unlink()
            except FileNotFoundError:
                pass
        removed.append(name)
    return removed
