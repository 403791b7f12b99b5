"""Distribution programs some tests drive for real (chromium, prometheus, promtool, PostgreSQL).

Without one, its tests skip and say which package to install; under CI (CI=true) a missing one
is a failure instead, so a CI image that lost a package never passes by skipping.
`.ci/run` installs them.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

PACKAGES = {"chromium": "chromium", "prometheus": "prometheus", "promtool": "prometheus",
            "initdb": "postgresql", "pg_ctl": "postgresql", "postgres": "postgresql"}
PG_DIRS = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)


def find_tool(name: str) -> str | None:
    found = shutil.which(name)
    if found is None and name in ("initdb", "pg_ctl", "postgres"):
        found = next((str(d / name) for d in PG_DIRS if (d / name).exists()), None)
    return found


def require_tool(name: str) -> str:
    """The program's path, or skip (fail under CI) naming the apt package that provides it."""
    path = find_tool(name)
    if path is None:
        why = f"{name} not installed (apt-get install {PACKAGES.get(name, name)})"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"{why}: CI must run this test")
        pytest.skip(why)
    return path
