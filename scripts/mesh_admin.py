#!/usr/bin/env python
"""Thin wrapper: `python -m app.cli` (app/cli/__main__.py) under its old name, e.g.

    python scripts/mesh_admin.py transfer --to n2 [--node 127.0.0.1:8770]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.cli.__main__ import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
