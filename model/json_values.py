"""Finite, built-in JSON values and their one canonical text.

Accepted values are exactly: ``None``, ``bool``, ``int`` (signed 64-bit), finite
``float``, ``str``, ``list`` of accepted values and ``dict`` with ``str`` keys and
accepted values, nested at most ``MAX_JSON_DEPTH`` deep. Subclasses (``IntEnum``,
``OrderedDict``, ...) and tuples are refused so that what is stored is what was meant.
Text may not contain NUL (PostgreSQL text cannot hold it) or unpaired surrogates (they
have no UTF-8 encoding), so every accepted value encodes and stores on every database.

Canonical text: UTF-8, keys sorted, compact separators, arrays in order, explicit
nulls, no Unicode normalization and no ASCII escaping.
"""

from __future__ import annotations

import copy
import json
import math
from typing import Any

from .bounds import MAX_JSON_DEPTH

__all__ = [
    "JsonValue",
    "json_problem",
    "text_problem",
    "canonical_json",
    "frozen_copy",
]

JsonValue = Any
"""A value accepted by :func:`json_problem` (spelled ``Any`` because it is recursive)."""

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and hashed faithfully, or None when it can."""
    if "\x00" in text:
        return "nul_character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid_unicode"
    return None


def json_problem(value: object, depth: int = 0) -> str | None:
    """The first reason ``value`` is not a finite built-in JSON value, or None.

    Iterative over siblings and recursive over depth (bounded by MAX_JSON_DEPTH), so a
    hostile value cannot exhaust the stack.
    """
    if depth > MAX_JSON_DEPTH:
        return "json_too_deep"
    kind = type(value)
    if value is None or kind is bool:
        return None
    if kind is int:
        return None if _INT64_MIN <= value <= _INT64_MAX else "json_integer_out_of_range"  # type: ignore[operator]
    if kind is float:
        return None if math.isfinite(value) else "json_not_finite"  # type: ignore[arg-type]
    if kind is str:
        return text_problem(value)  # type: ignore[arg-type]
    if kind is list:
        for item in value:  # type: ignore[attr-defined]
            problem = json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    if kind is dict:
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return "json_key_not_string"
            problem = text_problem(key) or json_problem(item, depth + 1)
            if problem is not None:
                return problem
        return None
    return "json_type_not_allowed"


def canonical_json(value: JsonValue) -> str:
    """The canonical text of an accepted value (see the module docstring)."""
    return json.dumps(
        value,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def frozen_copy(value: JsonValue) -> JsonValue:
    """A deep copy, so a caller mutating their dictionaries afterwards changes nothing."""
    return copy.deepcopy(value)
