"""Strategies built once per value, for the records and commands the other modules draw.

A strategy built inside a draw (``draw(st.sampled_from([...]))``) is a new object on every
example, and Hypothesis validates each new strategy before its first draw; its own cache
of strategies (1,024 entries) is soon full of the commands aimed at one record, so it
rarely helps. That validation was about a third of the CPU of every generated situation.
These helpers return the same strategy object for the same arguments, so each is built
and validated once. They build exactly what the ``st`` call they replace builds: the
examples drawn do not change (``tests/conformance/test_strategy_pools.py`` pins that).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Hashable, Iterable
from typing import Any, TypeVar, cast, overload

from hypothesis import strategies as st

__all__ = ["BOOLEANS", "sampled", "maybe", "optional", "integers"]

T = TypeVar("T")
E = TypeVar("E", bound=enum.Enum)

BOOLEANS = st.booleans()


@overload
def sampled(values: type[E]) -> st.SearchStrategy[E]: ...
@overload
def sampled(values: Iterable[T]) -> st.SearchStrategy[T]: ...
def sampled(values: Any) -> st.SearchStrategy[Any]:
    """``st.sampled_from(values)``, built once per pool (an Enum class or a sequence)."""
    return _sampled(values if isinstance(values, type) else tuple(values))


@functools.cache
def _sampled(values: Any) -> st.SearchStrategy[Any]:
    return st.sampled_from(values)


def maybe(value: T) -> st.SearchStrategy[T | None]:
    """``st.none() | st.just(value)`` (``value`` hashable)."""
    return cast("st.SearchStrategy[T | None]", _maybe(cast(Hashable, value)))


@functools.cache
def _maybe(value: Hashable) -> st.SearchStrategy[Any]:
    return st.none() | st.just(value)


def optional(strategy: st.SearchStrategy[T]) -> st.SearchStrategy[T | None]:
    """``st.none() | strategy`` (for a strategy that is itself built once)."""
    return cast("st.SearchStrategy[T | None]", _optional(strategy))


@functools.cache
def _optional(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | strategy


@functools.cache
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    """``st.integers(low, high)``."""
    return st.integers(low, high)
