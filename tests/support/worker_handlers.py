"""Handlers the worker-process tests run through ``tenure worker --handler worker_handlers:NAME``."""

from __future__ import annotations

import asyncio
import random
import sys
from typing import Any


async def brief(claimed: Any, context: Any) -> dict[str, Any]:
    """A short piece of work whose result names the claim that did it."""
    await asyncio.sleep(random.uniform(0.01, 0.06))
    return {"generation": context.generation, "owner": context.owner_id}


async def steady(claimed: Any, context: Any) -> dict[str, Any]:
    """Work long enough that a kill lands while claims are held."""
    await asyncio.sleep(random.uniform(0.05, 0.15))
    return {"generation": context.generation, "owner": context.owner_id}


async def third_of_a_second(claimed: Any, context: Any) -> dict[str, Any]:
    await asyncio.sleep(0.3)
    return {"generation": context.generation}


async def stuck(claimed: Any, context: Any) -> dict[str, Any]:
    await asyncio.sleep(3600)
    return {}


def not_async(claimed: Any, context: Any) -> None:
    return None


async def exits_on_request(claimed: Any, context: Any) -> dict[str, Any]:
    """``exit-*`` jobs call ``sys.exit(3)`` and ``interrupt-*`` jobs raise
    ``KeyboardInterrupt`` (as a library deep inside a handler might); the rest finish."""
    await asyncio.sleep(0)
    if claimed.job.data_source.startswith("exit"):
        sys.exit(3)
    if claimed.job.data_source.startswith("interrupt"):
        raise KeyboardInterrupt
    return {"generation": context.generation}
