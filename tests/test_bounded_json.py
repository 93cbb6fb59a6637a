"""``utilities.bounded_json``: the same values as ``json`` within bounds, a named refusal past them.

Plain pytest and hypothesis, no Django: the module is a pure core.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from utilities.bounded_json import MAX_DEPTH, JsonRefused, loads, nesting_depth, top_level_field

TEXT = st.text(alphabet=st.characters(blacklist_characters="\x00"))  # NUL is refused
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4),
    max_leaves=20,
)


def depth_of(value: Any) -> int:
    """The nesting depth, computed on the value (the reference for ``nesting_depth``)."""
    if isinstance(value, list):
        return 1 + max((depth_of(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((depth_of(v) for v in value.values()), default=0)
    return 0


@settings(max_examples=200, deadline=None)
@given(VALUES)
def test_values_within_bounds_parse_as_json_parses_them(value: Any) -> None:
    text = json.dumps(value)
    assert nesting_depth(text) == depth_of(value)
    assert loads(text) == json.loads(text)


@settings(max_examples=100, deadline=None)
@given(VALUES, st.integers(min_value=MAX_DEPTH + 1, max_value=3000))
def test_too_deep_is_refused_and_blamed_on_its_top_level_key(value: Any, depth: int) -> None:
    deep = "[" * depth + "]" * depth
    text = json.dumps({"fine": value, "bad key": "x"})[:-1] + ', "nested": ' + deep + "}"
    with pytest.raises(JsonRefused) as refused:
        loads(text)
    assert refused.value.field == "nested"
    assert f"Nested {depth + 1} levels" in refused.value.message  # counted from the outer {


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("[" * 100_000, None),  # json.loads: RecursionError
        ('{"gpus": 1e400}', "gpus"),  # inf
        ('{"a": 1, "gpus": -Infinity}', "gpus"),
        ('{"n": NaN}', "n"),
        ('{"big": 9223372036854775808}', "big"),  # one past a bigint
        ('{"big": ' + "9" * 5000 + "}", "big"),  # Python refuses 4300+ digits with ValueError
        ('{"t": "a\\u0000b"}', "t"),  # PostgreSQL refuses NUL in text
        ('{"a": "[[[[", "b": {"c": "\\\\u0000"}, "t": ["\\u0000"]}', "t"),
        ("{nope", None),
        (b"\xff\xfe", None),
    ],
)
def test_refusals_name_the_field(text: str | bytes, field: str | None) -> None:
    with pytest.raises(JsonRefused) as refused:
        loads(text)
    assert refused.value.field == field
    assert refused.value.message


def test_brackets_and_escapes_inside_strings_do_not_count() -> None:
    text = json.dumps({"a": "[" * 1000, "b": '\\"[[[', "c": "\\u0000 written out"})
    assert nesting_depth(text) == 1
    assert loads(text)["c"] == "\\u0000 written out"
    assert top_level_field(text, max_depth=0) is None
