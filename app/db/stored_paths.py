"""Paths as a node writes them into its own files: relative to its data dir.

A data dir can then be moved, copied or restored onto another machine (`python -m app.cli
snapshot`): the registry's model paths and the pipeline state's paths join whatever dir holds
them. Paths written before this (absolute, from wherever the dir lived) are found again under
the new dir by their tail, and written relative at the next save.
"""

from __future__ import annotations

from pathlib import Path


def to_stored(path: str | Path | None, root: Path) -> str | None:
    """How a path is written into a node's files: relative to the data dir when it lies under
    it, so a data dir can be moved, copied or restored elsewhere (absolute paths outside it,
    e.g. a configured model directory, stay as they are)."""
    if path is None:
        return None
    p = Path(path).resolve()  # a relative path is the cwd's
    try:
        return p.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(p)


def from_stored(stored: str | None, root: Path) -> str | None:
    """A stored path made absolute again: a relative one joins the data dir; an absolute one
    from a data dir that was moved (written before paths were relative) is found again under
    this one by its longest tail that exists here (`/old/data/models/x` -> `<root>/models/x`)."""
    if stored is None:
        return None
    p = Path(stored)
    if not p.is_absolute():
        return str(root / p)
    if p.is_relative_to(root.resolve()):
        return str(p)
    relocated = relocate(p, root)  # this dir's copy first, even while the old dir still exists
    return str(relocated) if relocated is not None else str(p)


def relocate(path: Path, root: Path) -> Path | None:
    """`path`'s longest tail that exists under `root`, or None."""
    parts = path.parts[1:]
    for i in range(len(parts) - 1):  # a tail of at least a folder and a name
        candidate = root.joinpath(*parts[i:])
        if candidate.exists():
            return candidate
    return None
