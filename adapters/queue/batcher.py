"""Batched writes: what a worker's claims submit while one batch call is under way goes
out together in the next one (completions as ``complete_many_owned``, the renewals of
late claims as ``heartbeat_many_owned``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .sources import MAX_BATCH

__all__ = ["Batcher"]


class Batcher:
    """Writes submitted while a batch call is under way go out together in the next one,
    at most :data:`~tenure.adapters.queue.sources.MAX_BATCH` per call. Runs as one task of
    the worker; each item's future receives its own answer, or the batch call's failure."""

    def __init__(self, call_many: Callable[[list[Any]], Awaitable[list[Any]]]) -> None:
        self._call_many = call_many
        self._waiting: list[tuple[Any, asyncio.Future[Any]]] = []
        self._ready = asyncio.Event()

    def submit(self, item: Any) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        self._ready.set()
        return future

    async def run(self) -> None:
        while True:
            await self._ready.wait()
            self._ready.clear()
            while self._waiting:
                batch = [(item, future) for item, future in self._waiting[:MAX_BATCH] if not future.done()]
                del self._waiting[:MAX_BATCH]
                if not batch:
                    continue
                try:
                    answers = await self._call_many([item for item, _ in batch])
                except Exception as error:  # noqa: BLE001 - handed to every caller of this batch
                    for _, future in batch:
                        if not future.done():
                            future.set_exception(error)
                    continue
                for (_, future), answer in zip(batch, answers, strict=True):
                    if not future.done():
                        future.set_result(answer)
