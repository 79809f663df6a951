"""Waiting for a condition in tests: a hang guard, never a timing.

``until`` polls ``check`` (a function returning a value or an awaitable of one) until its
value is truthy and returns that value; the timeout only turns a condition that never
comes into a failure instead of a hang, so it is generous and no test depends on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["until"]


async def until(
    check: Callable[[], Any | Awaitable[Any]], timeout_s: float = 60.0, *, what: str = "condition",
    interval_s: float = 0.02, tolerate: tuple[type[BaseException], ...] = (),
) -> Any:
    """``check``'s first truthy value; ``tolerate``: exceptions that count as "not yet"
    (a database restarting)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        with contextlib.suppress(*tolerate):
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
        if loop.time() > deadline:
            raise AssertionError(f"{what}: not met in {timeout_s:.0f} s (a hang guard, not a timing)")
        await asyncio.sleep(interval_s)
