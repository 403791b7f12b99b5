# Two entry points: `make run` (the main job) and `make test` (the suite). Both build .venv first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test venv clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(PY) -m app.p2p_orchestrator

test: $(STAMP)
	# two workers, one test file each at a time, in collection order (the long end-to-end files
	# first: tests/conftest.py), not xdist's default of the files with the most tests first
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=20

clean:
	rm -rf $(VENV) data .pytest_cache
