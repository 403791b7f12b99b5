"""JSON in and out of the mesh: bounded on the way in, always valid on the way out.

Python's json module reads `1e309` as `inf` and `NaN` as a float, and writes them back as
`Infinity` / `NaN`, which are not JSON: a peer's gossip could then make `/status` unreadable.
So parsing refuses non-finite numbers (as literals and as overflowing exponents), and writing
never emits them: a non-finite value that got in some other way is written as null and logged
(at a bounded rate) instead of breaking the answer.

Parsing runs on the event loop for every gossip message, heartbeat and answer, so the depth
is read off the text's skeleton (the text with every string emptied, by one regex: C speed),
not by walking the parsed value in Python (that walk was a sixth of a loaded node's event loop).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from app.coordination.p2p.refusals import RateLimitedLog

MAX_DEPTH = 32  # lists and objects, one inside the other
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


# A JSON string (valid JSON: every quote inside is escaped), emptied to leave the skeleton.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_INNERMOST = re.compile(r"\[\]|\{\}")


def skeleton(text: str) -> str:
    """Valid JSON text with every string emptied: its structure, numbers and literals."""
    return _STRING.sub('""', text)


def depth_of(skeleton_text: str, limit: int = MAX_DEPTH) -> int:
    """How many lists and objects valid JSON's skeleton nests (counted up to `limit` + 1): the
    brackets alone, their innermost pairs removed once per level."""
    brackets, depth = _NOT_BRACKET.sub("", skeleton_text), 0
    while brackets and depth <= limit:
        brackets = _INNERMOST.sub("", brackets)
        depth += 1
    return depth


def parse_json(raw: bytes | str) -> Any:
    """JSON (UTF-8 when bytes) with bounded depth, finite numbers and bounded integer digits;
    BadJson otherwise."""
    if not raw:
        return None
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        data = json.loads(text, parse_constant=_no_constants, parse_float=_finite_float)
    except RecursionError:
        raise BadJson(f"nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, not UTF-8, too many digits, NaN, 1e309
        raise BadJson(f"not valid JSON: {str(exc)[:200]}") from None
    if depth_of(skeleton(text)) > MAX_DEPTH:
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
