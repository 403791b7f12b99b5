"""Imports run downward only and form no circle (docs/ARCHITECTURE.md), read from the source.

Every `import`/`from ... import` of an `app` module counts, those under `if TYPE_CHECKING:`
too: a type-only circle is still two modules that cannot be understood one without the other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

APP = Path(__file__).resolve().parents[1] / "app"

pytestmark = pytest.mark.timeout(60)

# Layers, top first. A module may import its own layer (without circles) and any layer below.
# Packages on one row stand side by side and do not import each other. Each workload has one
# home (app/games, app/lm) whose subpackages sit on different rows: workload/ above the
# daemons, train/ below them, then search/ or rollout/, then the home's own core modules.
LAYERS: list[tuple[str, ...]] = [
    ("app.p2p_orchestrator", "app.cli"),
    ("app.workloads",),  # picks the configured workload's steps
    ("app.games.workload", "app.lm.workload"),  # each workload's pipeline steps: the seam's two sides
    ("app.coordination.pipeline",),
    ("app.coordination.sync",),
    ("app.coordination.p2p",),
    ("app.coordination.daemons",),
    ("app.games.train", "app.lm.train", "app.analyze"),
    ("app.lm.rollout",),
    ("app.games.search", "app.lm"),
    ("app.shared",),  # what both workloads use: torchrun, process group, manifests
    ("app.games", "app.db", "app.config", "app.log", "app.atomic_files", "app.free_ports"),
]
# The two workloads never import each other, at any layer.
WORKLOADS = {"app.lm": ("app.games", "app.analyze"), "app.games": ("app.lm",), "app.analyze": ("app.lm",)}
# Each workload's pipeline steps are reached through the seam only: app/workloads.py picks them.
STEPS_PACKAGES = ("app.games.workload", "app.lm.workload")
STEPS_IMPORTERS = ("app.workloads",)
# Third-party packages a part of the game home must not use (docs/ARCHITECTURE.md): the rules
# load no torch (app/config imports them), the search no database, neither talks HTTP.
FORBIDDEN_LIBRARIES = {"app.games": ("torch", "sqlalchemy", "aiohttp", "app.db"),
                       "app.games.search": ("sqlalchemy", "aiohttp", "app.db"),
                       "app.games.train": ("aiohttp",)}
NAMESPACES = {"app", "app.coordination"}  # empty package files that only group the layers


def module_name(path: Path) -> str:
    parts = path.relative_to(APP.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in APP.rglob("*.py")}


@cache
def parsed(path: Path) -> ast.Module:
    """Each file parsed once for all the tests here (read-only use)."""
    return ast.parse(path.read_text(), filename=str(path))


def imports_of(path: Path, modules: dict[str, Path]) -> set[str]:
    """The app modules `path` imports; `from pkg import name` counts as pkg.name when that is a module."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("app"):
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("app"))
    return found


def libraries_of(path: Path) -> set[str]:
    """Top-level names of every module `path` imports (``torch`` for ``torch.nn``), and app.db's
    modules as ``app.db``."""
    found: set[str] = set()
    for node in ast.walk(parsed(path)):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else (
            [a.name for a in node.names] if isinstance(node, ast.Import) else [])
        for name in names:
            found.add("app.db" if name == "app.db" or name.startswith("app.db.") else name.split(".")[0])
    return found


def layer_of(module: str) -> tuple[int, str]:
    """(row index, package) of the longest prefix of `module` named in LAYERS."""
    best: tuple[int, str] | None = None
    for row, packages in enumerate(LAYERS):
        for package in packages:
            if (module == package or module.startswith(package + ".")) and (best is None or len(package) > len(best[1])):
                best = (row, package)
    if best is None:
        raise AssertionError(f"{module} belongs to no layer: add its package to LAYERS and docs/ARCHITECTURE.md")
    return best


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    return {name: {m for m in imports_of(path, modules) if m != name} for name, path in modules.items()
            if name not in NAMESPACES}


def test_namespaces_import_nothing() -> None:
    modules = all_modules()
    assert {name: imports_of(modules[name], modules) for name in NAMESPACES} == {name: set() for name in NAMESPACES}


def test_no_upward_or_sideways_import() -> None:
    bad = []
    for module, targets in import_graph().items():
        row, package = layer_of(module)
        for target in targets:
            target_row, target_package = layer_of(target)
            if target_row < row or (target_row == row and target_package != package):
                bad.append(f"{module} -> {target}")
    assert not bad, "imports that run up or sideways:\n" + "\n".join(sorted(bad))


def test_the_workloads_do_not_import_each_other() -> None:
    bad = [f"{module} -> {target}" for module, targets in import_graph().items() for target in targets
           for home, foreign in WORKLOADS.items()
           if (module == home or module.startswith(home + ".")) and any(
               target == f or target.startswith(f + ".") for f in foreign)]
    assert not bad, "imports between the workloads:\n" + "\n".join(sorted(bad))


def test_only_the_workload_picker_imports_a_workloads_steps() -> None:
    bad = [f"{module} -> {target}" for module, targets in import_graph().items() for target in targets
           for steps in STEPS_PACKAGES
           if (target == steps or target.startswith(steps + ".")) and module not in STEPS_IMPORTERS
           and not (module == steps or module.startswith(steps + "."))]
    assert not bad, "a workload's steps imported around the seam:\n" + "\n".join(sorted(bad))


def test_the_game_home_uses_no_forbidden_library() -> None:
    bad = []
    for name, path in all_modules().items():
        if not (name == "app.games" or name.startswith("app.games.")):
            continue
        part = layer_of(name)[1]
        for library in FORBIDDEN_LIBRARIES.get(part, ()):
            if library in libraries_of(path):
                bad.append(f"{name} imports {library}")
    assert not bad, "\n".join(sorted(bad))


def test_no_two_modules_share_a_name() -> None:
    """One name, one job: `app/games/search/model.py` and an LM `model.py` read alike in a traceback.
    Exceptions: app/config's settings modules (named after what they configure), and the leader's
    work queue, whose table (db/work_queue.py) and logic (p2p/work_queue.py) are one job."""
    seen: dict[str, list[str]] = {}
    for path in APP.rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py", "work_queue.py") and path.parent.name != "config":
            seen.setdefault(path.name, []).append(str(path.relative_to(APP.parent)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}


def test_no_import_circle() -> None:
    circles = find_circles(import_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_a_node_and_the_cli_start_without_torch() -> None:
    """torch costs ~2 CPU s per process; a node loads it only once it runs a network (a model
    to score, a gauntlet device to resolve), the CLI only for `registry evaluate`. Its game
    workers still get it from the forkserver's preload (app/games/worker_processes.py)."""
    code = ("import sys, app.p2p_orchestrator, app.cli.__main__, app.cli.registry_commands; "
            "from app.games.worker_processes import PRELOAD; "
            "print('torch' in sys.modules, 'app.games.search.model' in PRELOAD)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50,
                         cwd=APP.parent)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]


def test_the_checker_sees_circles_and_layers() -> None:
    """The rules themselves: a circle and an upward import are found, a clean graph passes."""
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert find_circles({"a": {"b"}, "b": set()}) == []
    assert layer_of("app.games.connect4")[0] > layer_of("app.games.search.mcts")[0] > layer_of("app.games.train.train")[0] \
        > layer_of("app.coordination.pipeline.runners")[0] > layer_of("app.games.workload.game_steps")[0]
    assert layer_of("app.games.workload.game_steps")[0] == layer_of("app.lm.workload.lm_steps")[0]
    assert layer_of("app.games.train.gauntlet")[0] == layer_of("app.lm.train.grpo")[0]
    assert "torch" in libraries_of(APP / "games" / "train" / "train.py")
    assert "app.db" in libraries_of(APP / "games" / "train" / "selfplay.py")
    assert layer_of("app.lm.tasks")[0] > layer_of("app.lm.rollout.engine")[0] > layer_of("app.lm.train.grpo")[0]
    assert layer_of("app.coordination.pipeline.runners")[0] > layer_of("app.lm.workload.lm_steps")[0]
    assert layer_of("app.coordination.p2p.node")[0] > layer_of("app.coordination.pipeline.cluster")[0]
