"""freeze_json (the C-speed path) answers exactly as json_problem (the plain definition)."""

from __future__ import annotations

import collections
import enum
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tenure.model.json_values import MAX_JSON_DEPTH, JsonProblem, canonical_json, freeze_json, json_problem, load_json

# Values JSON accepts, values it must refuse, and near misses mixed together.
leaves = (
    st.none() | st.booleans() | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=6)
    | st.sampled_from(["\x00", "a\\u0000b", "\ud800", "\\", "é"])
    | st.tuples(st.integers()) | st.binary(max_size=2) | st.sets(st.integers(), max_size=2)
)
keys = st.text(max_size=4) | st.integers(-3, 3) | st.booleans() | st.none() | st.sampled_from(["\x00", "\ud800"])
values = st.recursive(
    leaves,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=15,
)


@given(value=values)
def test_the_fast_path_accepts_exactly_what_the_definition_accepts(value: Any) -> None:
    expected = json_problem(value)
    try:
        copy, text = freeze_json(value)
    except JsonProblem as problem:
        assert expected is not None
        assert problem.code == expected or expected in ("json_key_not_string", "json_type_not_allowed")
        return
    assert expected is None
    assert copy == value and text == canonical_json(value)


@given(value=st.dictionaries(st.text("abc", max_size=4), st.lists(st.integers(-5, 5), max_size=3), max_size=4))
def test_the_copy_shares_nothing_with_the_value(value: dict[str, list[int]]) -> None:
    copy, _ = freeze_json(value)
    for key in copy:
        copy[key].append(99)
        assert 99 not in value[key]


class Colour(enum.IntEnum):
    RED = 1


def test_subclasses_are_kept_as_the_plain_values_they_encode_to() -> None:
    copy, text = freeze_json({"colour": Colour.RED, "ordered": collections.OrderedDict(b=1, a=2)})
    assert text == '{"colour":1,"ordered":{"a":2,"b":1}}'
    assert type(copy["colour"]) is int and type(copy["ordered"]) is dict


def test_refusals_name_the_problem() -> None:
    cases = {
        "json_not_finite": {"x": math.nan},
        "json_integer_out_of_range": {"x": 2**63},
        "nul_character": {"x": "a\x00b"},
        "invalid_unicode": {"x": "\ud800"},
        "json_type_not_allowed": {"x": (1, 2)},
        "json_key_not_string": {1: "x"},
    }
    for code, value in cases.items():
        try:
            freeze_json(value)
        except JsonProblem as problem:
            assert problem.code == code, (code, problem.code)
        else:
            raise AssertionError(code)


def test_a_literal_backslash_u0000_is_text_not_nul() -> None:
    copy, text = freeze_json({"k": "a\\u0000b"})
    assert copy == {"k": "a\\u0000b"} and text == '{"k":"a\\\\u0000b"}'


# --- the nesting bound: the same answer written and read, whatever the stack --------


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def at_stack_depth(frames: int, call: Any) -> Any:
    """``call()`` run ``frames`` Python frames deeper than here."""
    return call() if frames == 0 else at_stack_depth(frames - 1, call)


def test_values_as_deep_as_the_bound_are_accepted_and_one_level_deeper_refused() -> None:
    assert json_problem(nested(MAX_JSON_DEPTH)) is None
    assert freeze_json(nested(MAX_JSON_DEPTH))[0] == nested(MAX_JSON_DEPTH)
    assert json_problem(nested(MAX_JSON_DEPTH + 1)) == "json_too_deep"
    with pytest.raises(JsonProblem) as caught:
        freeze_json(nested(MAX_JSON_DEPTH + 1))
    assert caught.value.code == "json_too_deep"


def test_a_value_written_at_the_bound_reads_back_under_a_deep_call_stack() -> None:
    _, text = freeze_json(nested(MAX_JSON_DEPTH))
    assert at_stack_depth(400, lambda: load_json(text)) == nested(MAX_JSON_DEPTH)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 990, 5_000, 100_000])
def test_stored_text_nested_past_the_bound_is_refused_without_recursion_error(depth: int) -> None:
    text = '{"x": ' + "[" * depth + "]" * depth + "}"
    for frames in (0, 600):
        with pytest.raises(JsonProblem) as caught:
            at_stack_depth(frames, lambda: load_json(text))
        assert caught.value.code == "json_too_deep" and isinstance(caught.value, ValueError)


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    text = canonical_json({"s": "[" * 1000 + '\\"{' * 500, "t": ["]]]"]})
    assert load_json(text) == {"s": "[" * 1000 + '\\"{' * 500, "t": ["]]]"]}


@pytest.mark.parametrize("text", ["", "{", "nope", '{"a": 1,}'])
def test_text_that_is_not_json_is_refused_as_json_invalid(text: str) -> None:
    with pytest.raises(JsonProblem) as caught:
        load_json(text)
    assert caught.value.code == "json_invalid"


@given(value=values)
def test_the_canonical_text_is_what_json_dumps_writes_with_the_canonical_options(value: object) -> None:
    """``canonical_json`` encodes with one encoder made once (issue 51): the same text as
    ``json.dumps`` with the canonical options, and the same refusal where it refuses."""
    import json

    def dumped(encode: Any) -> tuple[str, Any]:
        try:
            return "text", encode(value)
        except (TypeError, ValueError, RecursionError) as error:
            return "refused", type(error)

    assert dumped(canonical_json) == dumped(lambda v: json.dumps(v, sort_keys=True, separators=(",", ":"),
                                                                 ensure_ascii=False, allow_nan=False))
