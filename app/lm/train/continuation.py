"""A generation that trains on from the run before it on this node: the optimizer's state too.

The pipeline's trainer runs on (a rejected candidate is the next generation's parent unless it
regressed; a promoted one is the best, the parent anyway). The parent directory carries the
weights; the run that made it also left its last GRPO checkpoint, with AdamW's moments and step.
Loading that checkpoint makes the next generation continue the same optimisation (no fresh
moments, no second warm-up), as a trainer that never stopped would. It is taken only when it
is provably the parent's: that run's candidate has the parent's sha256 and its newest complete
GRPO checkpoint is its last step; otherwise the run starts fresh from the parent, saying why.
"""

from __future__ import annotations

import json
from pathlib import Path

from app.lm.train.checkpoint_dirs import newest_complete

RESULT_NAME = "result.json"  # what a finished run writes beside its candidate (generation.py)


def continued_checkpoint(run_dir: Path | None, parent_sha256: str | None) -> tuple[Path | None, str]:
    """(the checkpoint to continue from, "") or (None, why not)."""
    if run_dir is None:
        return None, "no run to continue"
    if parent_sha256 is None:
        return None, "no parent"
    try:
        result = json.loads((run_dir / RESULT_NAME).read_text())
    except (OSError, ValueError) as exc:
        return None, f"{run_dir / RESULT_NAME}: unreadable ({exc})"
    if result.get("candidate_sha256") != parent_sha256:
        return None, f"{run_dir}'s candidate is not the parent"
    steps = result.get("rl_steps")
    found = newest_complete(run_dir / "rl")
    if not isinstance(steps, int) or steps <= 0 or found is None or found[0] != steps:
        return None, f"{run_dir / 'rl'}: no complete checkpoint of its last GRPO step"
    return found[1], ""
