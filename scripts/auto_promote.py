"""Thin wrapper: `python -m app.cli registry ...` (app/cli/registry_commands.py) under its old name.

    python scripts/auto_promote.py evaluate data/models/gen3.safetensors
    python scripts/auto_promote.py promote <sha256-prefix> --reason "manual"
    python scripts/auto_promote.py rollback <sha256-prefix> --reason "gen 5 plays badly"
    python scripts/auto_promote.py progress | list
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.cli.registry_commands import main as _registry_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _registry_main(argv, prog="scripts/auto_promote.py")


if __name__ == "__main__":
    sys.exit(main())
