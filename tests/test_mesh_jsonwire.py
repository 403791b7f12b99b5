"""The mesh's JSON reader: what it refuses (too deep, non-finite numbers, not UTF-8), and that
its C-speed checks on the text's skeleton agree with a walk of the parsed value."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.coordination.p2p.jsonwire import MAX_DEPTH, BadJson, depth_of, dumps, parse_json, skeleton


def walked_depth(value) -> int:
    """The reference: how many lists and objects a parsed value nests, walked."""
    if isinstance(value, dict):
        return 1 + max((walked_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((walked_depth(v) for v in value), default=0)
    return 0


def nested(depth: int) -> str:
    """`depth` lists and objects, one inside the other, around a number."""
    text = "0"
    for i in range(depth):
        text = f'{{"k{i}": {text}}}' if i % 2 else f"[{text}]"
    return text


@pytest.mark.parametrize("depth", [0, 1, 2, MAX_DEPTH - 1, MAX_DEPTH])
def test_nesting_up_to_the_bound_is_read(depth: int) -> None:
    assert walked_depth(parse_json(nested(depth))) == depth


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, MAX_DEPTH + 5, 5000])
def test_nesting_past_the_bound_is_refused(depth: int) -> None:
    with pytest.raises(BadJson, match="nested deeper"):
        parse_json(nested(depth).encode())


def test_brackets_and_quotes_inside_strings_are_not_structure() -> None:
    text = json.dumps({"a": "[[[[{{{{" * 20 + '\\"]]}}', "b": ['"', "\\", "e123 1e999 " + "9" * 400]})
    value = parse_json(text)
    assert walked_depth(value) == 2 and value["b"][2].startswith("e123")


@pytest.mark.parametrize("number", ["1e309", "-1e400", "1" * 400 + ".0", "1.5E+999", "NaN", "-Infinity", "Infinity"])
def test_numbers_a_float_cannot_hold_are_refused(number: str) -> None:
    with pytest.raises(BadJson):
        parse_json(f'{{"x": [1, {number}]}}'.encode())


@pytest.mark.parametrize("number", ["1e308", "1e-400", "1.0e100", "123456789012345678901234567890"])
def test_large_but_finite_numbers_are_read(number: str) -> None:
    value = parse_json(f"[{number}]")
    assert math.isfinite(value[0])


@pytest.mark.parametrize("raw", [b"\xff\xfe{}", b'{"a": "\xc3"}', b"{", b"[1,]", "9" * 5000])
def test_not_json_is_refused_with_a_reason(raw) -> None:
    with pytest.raises(BadJson, match="not valid JSON"):
        parse_json(raw)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab"\\[]{}e1 \u00e9\n'), max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_the_skeleton_checks_agree_with_the_parsed_value(value) -> None:
    text = dumps(value)
    assert depth_of(skeleton(text), limit=1000) == walked_depth(value)
    assert parse_json(text.encode()) == json.loads(text)
