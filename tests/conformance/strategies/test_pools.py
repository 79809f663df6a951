"""The strategy pools build each strategy once and draw exactly what the call they
replace draws (conformance/strategies/pools.py): the generated records and commands stay
the same examples, only cheaper to make."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.pools import BOOLEANS, integers, maybe, optional, sampled


class Colour(enum.Enum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


def draws(strategy: st.SearchStrategy[Any], count: int = 200) -> list[Any]:
    """The first ``count`` values a fixed seed draws from ``strategy``."""
    seen: list[Any] = []

    @seed(20261206)
    @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def collect(data: st.DataObject) -> None:
        seen.append(data.draw(strategy))

    collect()
    return seen


PAIRS: dict[str, tuple[Callable[[], st.SearchStrategy[Any]], Callable[[], st.SearchStrategy[Any]]]] = {
    "a list": (lambda: sampled(["a", "b", "c"]), lambda: st.sampled_from(["a", "b", "c"])),
    "an enum": (lambda: sampled(Colour), lambda: st.sampled_from(Colour)),
    "a value or none": (lambda: maybe("boom"), lambda: st.none() | st.just("boom")),
    "a pool or none": (lambda: optional(sampled((1, 2, 3))), lambda: st.none() | st.sampled_from((1, 2, 3))),
    "a range": (lambda: integers(-3, 40), lambda: st.integers(-3, 40)),
    "a boolean": (lambda: BOOLEANS, st.booleans),
}


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_a_pooled_strategy_draws_what_the_call_it_replaces_draws(case: str) -> None:
    pooled, plain = PAIRS[case]
    assert draws(pooled()) == draws(plain())


@pytest.mark.parametrize("case", sorted(PAIRS))
def test_a_pooled_strategy_is_built_once(case: str) -> None:
    pooled, _ = PAIRS[case]
    assert pooled() is pooled()


def test_the_same_values_in_a_new_list_share_one_strategy_and_other_values_do_not() -> None:
    assert sampled([0, 50, 100]) is sampled([0, 50, 100]) is sampled((0, 50, 100))
    assert sampled([0, 50, 100]) is not sampled([0, 50])
    assert maybe("a") is not maybe("b")
