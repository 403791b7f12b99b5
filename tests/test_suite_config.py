"""The suite as CI runs it: `make test` (what .ci/run calls) runs the tests marked `slow` too, so
marking a test slow never takes it out of CI; the marker only lets a developer skip it locally."""

from __future__ import annotations

import re
import tomllib

from tests.conftest import REPO


def test_ci_runs_make_test_and_make_test_deselects_nothing() -> None:
    assert "make test" in (REPO / ".ci" / "run").read_text()
    recipe = re.search(r"^test:.*\n((?:\t.*\n)+)", (REPO / "Makefile").read_text(), re.M)
    assert recipe is not None, "Makefile has no test target"
    commands = recipe.group(1)
    pytest_args = commands.split("pytest", 1)[1] if "pytest" in commands else ""
    assert pytest_args and " -m " not in pytest_args and "slow" not in pytest_args, commands
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-m" not in options.get("addopts", "").split() and "not slow" not in options.get("addopts", "")
    assert any(m.startswith("slow:") for m in options["markers"])


def test_every_real_node_e2e_file_is_marked_slow() -> None:
    files = sorted((REPO / "tests").glob("test_*_e2e.py"))
    assert files, "no e2e test files found"
    for path in files:
        assert "pytestmark = pytest.mark.slow" in path.read_text(), path.name
