"""JSON in and out of the mesh: bounded on the way in, always valid on the way out.

Python's json module reads `1e309` as `inf` and `NaN` as a float, and writes them back as
`Infinity` / `NaN`, which are not JSON: a peer's gossip could then make `/status` unreadable.
So parsing refuses non-finite numbers (as literals and as overflowing exponents), and writing
never emits them: a non-finite value that got in some other way is written as null and logged
(at a bounded rate) instead of breaking the answer.
"""

from __future__ import annotations

import json
import math
from typing import Any

from app.coordination.p2p.refusals import RateLimitedLog

MAX_DEPTH = 32
_LOG = RateLimitedLog(60.0)


class BadJson(ValueError):
    """The text is not JSON the mesh accepts; the message says why."""


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:40]} is not a finite number")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > MAX_DEPTH:
            break
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return deepest


def parse_json(raw: bytes | str) -> Any:
    """JSON with bounded depth, finite numbers and bounded integer digits; BadJson otherwise."""
    try:
        data = json.loads(raw, parse_constant=_no_constants, parse_float=_finite_float) if raw else None
    except RecursionError:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError, too many digits, NaN, 1e309
        raise BadJson(f"not valid JSON: {str(exc)[:200]}") from None
    if _depth(data) > MAX_DEPTH:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels")
    return data


def _finite_only(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_only(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_only(v) for v in value]
    return value


def dumps(value: Any) -> str:
    """JSON text that every parser accepts: a non-finite float becomes null (and is logged)."""
    try:
        return json.dumps(value, allow_nan=False)
    except ValueError:
        _LOG.emit("non_finite", "non_finite_number_written_as_null")
        return json.dumps(_finite_only(value), allow_nan=False)
