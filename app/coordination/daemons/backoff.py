"""Pure timing decisions shared by the daemon manager and the dead-letter retries.

They are pure (no clock, no sleep, randomness passed in) so that hypothesis can check their
properties exhaustively and the callers only gather the inputs and act on the answer.
"""

from __future__ import annotations

import random
from collections.abc import Iterable

# 2**62 seconds is far beyond any cap; clamping the exponent keeps the float finite.
_MAX_EXPONENT = 62


def restart_delay(
    attempt: int, base: float = 1.0, cap: float = 300.0, jitter: random.Random | None = None
) -> float:
    """Seconds to wait before restart number `attempt` (0 = first restart after a crash).

    Exponential `base * 2**attempt`, capped at `cap`, then "equal jitter": a uniformly random
    point in the upper half [d/2, d]. Equal rather than full jitter because it still spreads
    restarts of many nodes apart while keeping every delay at least as long as the previous
    uncapped one, so a crashing daemon never restarts faster the more it crashes.
    """
    if attempt < 0:
        raise ValueError(f"attempt must be >= 0, got {attempt}")
    if base <= 0 or cap <= 0:
        raise ValueError(f"base and cap must be > 0, got base={base} cap={cap}")
    delay = min(cap, base * 2.0 ** min(attempt, _MAX_EXPONENT))
    if jitter is None:
        return delay
    return delay / 2.0 + jitter.random() * delay / 2.0


def is_crash_loop(start_times: Iterable[float], now: float, limit: int = 5, window: float = 60.0) -> bool:
    """True when `limit` or more starts happened in the last `window` seconds (now - window, now]."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return sum(1 for t in start_times if now - window < t <= now) >= limit


def should_reset_backoff(healthy_for: float, reset_after: float) -> bool:
    """A daemon that stayed up `reset_after` seconds earns a fresh backoff sequence."""
    return healthy_for >= reset_after
