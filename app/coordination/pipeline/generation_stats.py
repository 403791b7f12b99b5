"""Per-node generation stats, gossiped: each node reads what it holds of every model's Elo
interval (its registry), training loss (its runs' result.json) and solved-position accuracy
(strength_watch.py) and gossips the newest as `gen_stats`, so any node's dashboard and /progress
can show every generation (dashboard_feed.py) wherever it was trained, rated or scored."""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

from app.config.paths import NodePaths
from app.db.engines import is_url
from app.db.registry import ModelRegistry, RegistryError
from app.games.train.solved_accuracy import ACCURACY_FILE, AccuracyCache
from app.log import get_logger

log = get_logger(__name__)

STATS_GOSSIPED = 100  # newest models whose Elo/loss a node gossips
STATS_TTL_S = 5.0
STATS_FIELDS = 6  # gen_stats rows: elo, elo_low, elo_high, loss, exact, outcome
_stats_cache: dict[Path, tuple[float, dict[str, list]]] = {}
_stats_lock = threading.Lock()


def registry_exists(target: Path | str) -> bool:
    """A registry file that exists, or a database URL (whose tables the node creates)."""
    return is_url(target) or Path(target).exists()


def generation_stats(paths: NodePaths, ttl_s: float = STATS_TTL_S) -> dict[str, list]:
    """{sha256: [elo, elo_low, elo_high, loss, exact, outcome]} of the models this node
    registered, trained or scored on the solved positions (newest STATS_GOSSIPED); cached for
    `ttl_s` since the inventory asks every second."""
    now = time.monotonic()
    with _stats_lock:
        hit = _stats_cache.get(paths.data_dir)
        if hit is not None and now - hit[0] < ttl_s:
            return hit[1]
    stats: dict[str, list] = {}
    row = lambda sha: stats.setdefault(sha, [None] * STATS_FIELDS)  # noqa: E731
    for sha, loss in _training_losses(paths.runs_dir).items():
        row(sha)[3] = loss
    if registry_exists(paths.registry_db):
        try:
            with ModelRegistry(paths.registry_db, create=False) as registry:
                for m in registry.models():
                    if m.elo is not None:
                        row(m.sha256)[:3] = [m.elo, m.elo_low, m.elo_high]
        except RegistryError as exc:
            log.warning("dashboard_registry_unreadable", error=str(exc))
    for sha, result in AccuracyCache(paths.data_dir / ACCURACY_FILE).load().items():
        row(sha)[4:6] = [result["exact"], result["outcome"]]
    newest = dict(list(stats.items())[-STATS_GOSSIPED:])
    with _stats_lock:
        _stats_cache[paths.data_dir] = (now, newest)
    return newest


def _training_losses(runs_dir: Path) -> dict[str, float]:
    """candidate sha256 -> best held-out loss, from each run's result.json."""
    out: dict[str, float] = {}
    if not runs_dir.is_dir():
        return out
    for result in sorted(runs_dir.glob("gen_*/result.json")):
        try:
            data = json.loads(result.read_text())
        except (OSError, ValueError):
            continue  # being written, or not ours: skip, the next sample reads it
        sha, loss = data.get("candidate_sha256"), data.get("best_holdout_loss")
        if isinstance(sha, str) and isinstance(loss, (int, float)):
            out[sha] = float(loss)
    return out


def stats_row(value: Any) -> list[float | None]:
    """A gossiped gen_stats row as numbers (a peer's message is checked like any other: a row
    that is not a list of finite numbers or nulls is ignored; older nodes send four fields)."""
    if not isinstance(value, list):
        return []
    row = value[:STATS_FIELDS]
    ok = all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)) for v in row)
    return list(row) if ok else []
