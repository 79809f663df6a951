"""Finite, built-in JSON values and their one canonical text.

Accepted values are exactly: ``None``, ``bool``, ``int`` (signed 64-bit), finite
``float``, ``str``, ``list`` of accepted values and ``dict`` with ``str`` keys and
accepted values. Tuples, sets, bytes and other types are refused. A subclass of one of
these types (``IntEnum``, ``OrderedDict``) is kept as the plain value it encodes to: the
copy that is stored is always made of plain built-in types. Text may not contain NUL (PostgreSQL text
cannot hold it) or unpaired surrogates (they have no UTF-8 encoding), so every accepted
value encodes and stores on every database.

Nesting is bounded by :data:`MAX_JSON_DEPTH`, a fixed number well below the interpreter's
recursion limit: deeper values are refused (``json_too_deep``) on the way in, and a
stored text nested deeper (written by another client) is refused by :func:`load_json` on
the way out, so no read can exhaust the stack and tenure never writes a value that a
deeper call stack could not read back.

Canonical text: UTF-8, keys sorted, compact separators, arrays in order, explicit
nulls, no Unicode normalization and no ASCII escaping.

:func:`freeze_json` checks and copies a value at C speed: it encodes the canonical text,
decodes it again, and accepts the value only when the decoded copy equals it and has
exactly its types (which rules out tuples, non-string keys and subclasses). Anything it
cannot settle that way falls back to :func:`json_problem`, the plain recursive
definition, which names the problem. A property test holds the two to the same answers.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from typing import Any

__all__ = [
    "JsonValue",
    "json_problem",
    "text_problem",
    "canonical_json",
    "freeze_json",
    "JsonProblem",
    "MAX_JSON_DEPTH",
    "load_json",
]

JsonValue = Any
"""A value accepted by :func:`json_problem` (spelled ``Any`` because it is recursive)."""

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

MAX_JSON_DEPTH = 256
"""The deepest nesting of arrays and objects accepted, written or read (``[[1]]`` is 2).
Fixed, so the answer never depends on how deep the caller's stack is; a quarter of the
interpreter's default recursion limit, so decoding, comparing and encoding a value this
deep leaves room for any caller's frames."""


def text_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored and hashed faithfully, or None when it can."""
    if "\x00" in text:
        return "nul_character"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "invalid_unicode"
    return None


def json_problem(value: object) -> str | None:
    """The first reason ``value`` is not a finite built-in JSON value, or None."""
    try:
        return _problem(value, 0)
    except RecursionError:
        return "json_too_deep"


def _problem(value: object, depth: int) -> str | None:
    if isinstance(value, (list, dict)):
        depth += 1
        if depth > MAX_JSON_DEPTH:
            return "json_too_deep"
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if _INT64_MIN <= value <= _INT64_MAX else "json_integer_out_of_range"
    if isinstance(value, float):
        return None if math.isfinite(value) else "json_not_finite"
    if isinstance(value, str):
        return text_problem(value)
    if isinstance(value, list):
        for item in value:
            problem = _problem(item, depth)
            if problem is not None:
                return problem
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return "json_key_not_string"
            problem = text_problem(key) or _problem(item, depth)
            if problem is not None:
                return problem
        return None
    return "json_type_not_allowed"


_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
"""The canonical encoder, made once: ``json.dumps`` with these options builds a new
encoder on every call (two Python calls of the four a value cost; a submission encodes
some eighteen values: issue 51). An encoder keeps no state between calls."""


def canonical_json(value: JsonValue) -> str:
    """The canonical text of an accepted value (see the module docstring)."""
    return _CANONICAL.encode(value)



_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def depth_problem(text: str) -> str | None:
    """``json_too_deep`` when JSON ``text`` nests deeper than :data:`MAX_JSON_DEPTH`, else
    None. Linear and without recursion; a text with no more brackets than the bound is
    settled by counting them (C speed), which is every text tenure itself writes unless
    it holds many containers."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return None
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = max(itertools.accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)
    return "json_too_deep" if depth > MAX_JSON_DEPTH else None


def load_json(text: str) -> JsonValue:
    """The value a stored JSON text holds. Raises :class:`JsonProblem` (a ``ValueError``)
    when the text is not JSON or nests deeper than :data:`MAX_JSON_DEPTH`: a reader turns
    that into its ``corrupt_row`` refusal, never a ``RecursionError``."""
    problem = depth_problem(text)
    if problem is not None:
        raise JsonProblem(problem)
    try:
        return json.loads(text)
    except RecursionError:  # only under a caller already near the interpreter's limit
        raise JsonProblem("json_too_deep") from None
    except ValueError:
        raise JsonProblem("json_invalid") from None


class JsonProblem(ValueError):
    """A value that is not finite built-in JSON; ``code`` names the problem."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class _OutOfRange(Exception):
    pass


def _int64(text: str) -> int:
    number = int(text)
    if not _INT64_MIN <= number <= _INT64_MAX:
        raise _OutOfRange
    return number


_CHECKING_DECODER = json.JSONDecoder(parse_int=_int64)
"""``json.loads(text, parse_int=_int64)``'s decoder, made once (``loads`` with an option
builds one on every call)."""


def _same_structure(copy_value: object, value: object) -> bool:
    """The decoded copy equals the value: a tuple never equals the list it decodes to,
    a non-string key never equals the string key it decodes to, so equality refuses
    both. (A subclass of a JSON type equals its plain decoded value and is accepted: what
    is kept is the plain value, exactly as the canonical text spells it.)"""
    return isinstance(value, (dict, list, str, int, float, type(None))) and copy_value == value


def freeze_json(value: object) -> tuple[JsonValue, str]:
    """A deep copy of ``value`` that shares nothing with it, and its canonical text.

    Raises :class:`JsonProblem` when ``value`` is not finite built-in JSON.
    """
    try:
        text = canonical_json(value)
    except RecursionError:
        raise JsonProblem("json_too_deep") from None
    except (TypeError, ValueError):
        raise JsonProblem(json_problem(value) or "json_type_not_allowed") from None
    if depth_problem(text) is not None:
        raise JsonProblem("json_too_deep")
    decoded: object = _UNDECODED
    try:
        text.encode("utf-8")  # unpaired surrogates cannot be encoded
        decoded = _CHECKING_DECODER.decode(text)
    except (UnicodeEncodeError, ValueError, RecursionError, _OutOfRange):
        pass
    # JSON escapes NUL as \u0000; the same six characters also appear when a string
    # holds a literal backslash followed by u0000, so a match is settled by the walk.
    if "\\u0000" not in text and decoded is not _UNDECODED and _same_structure(decoded, value):
        return decoded, text
    problem = json_problem(value)
    if problem is not None:
        raise JsonProblem(problem)
    if decoded is not _UNDECODED and _same_structure(decoded, value):
        return decoded, text
    raise JsonProblem("json_not_canonical")


_UNDECODED = object()
