"""The PostgreSQL pool's slots (``connections.Slots``, issue 51: a free slot taken with no
call into asyncio): never more holders than slots, waiters served first come first
served, and no slot lost when a wait is cancelled, including a waiter cancelled just as
a slot was handed to it. Driven by Hypothesis over interleavings of takes, gives and
cancellations on one event loop (no database, no timing: every step is a loop turn)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.adapters.postgres.connections import Slots

STEPS = st.lists(st.one_of(
    st.just(("take",)),
    st.tuples(st.just("give"), st.integers(0, 20)),
    st.tuples(st.just("cancel"), st.integers(0, 20)),
    st.tuples(st.just("give and cancel"), st.integers(0, 20), st.integers(0, 20)),
    st.just(("turn",)),
), max_size=60)


async def _run(size: int, steps: list[tuple[Any, ...]], slots: Slots) -> None:
    holders: list[int] = []
    tasks: list[asyncio.Task[None]] = []
    took: list[int] = []
    order: list[int] = []

    async def take(number: int) -> None:
        await slots.take()
        holders.append(number)
        took.append(number)

    def check() -> None:
        assert len(holders) <= size
        assert slots.free == size - len(holders)
        live = [waiter for waiter in slots.waiters if not waiter.done()]
        assert not (slots.free and live), "a slot is free while a live waiter waits"

    for step in steps:
        if step[0] == "take":
            number = len(tasks)
            order.append(number)
            tasks.append(asyncio.ensure_future(take(number)))
        elif step[0] == "give" and holders:
            holders.pop(step[1] % len(holders))
            slots.give()
        elif step[0] == "cancel" and tasks:
            tasks[step[1] % len(tasks)].cancel()
        elif step[0] == "give and cancel" and holders and tasks:
            holders.pop(step[1] % len(holders))
            slots.give()  # handed to the first waiter, which has not resumed yet ...
            tasks[step[2] % len(tasks)].cancel()  # ... when a waiter's deadline passes
        for _ in range(5):  # the woken (or cancelled) waiters run
            await asyncio.sleep(0)
        check()
    # The end: every holder gives its slot back; every waiter not cancelled gets one.
    for _ in range(1000):
        for _ in range(5):
            await asyncio.sleep(0)
        check()
        pending = [task for task in tasks if not task.done()]
        if holders:
            holders.pop()
            slots.give()
        elif not pending:
            break
    else:
        raise AssertionError("a waiter was never served")
    assert slots.free == size and not [waiter for waiter in slots.waiters if not waiter.done()]
    assert all(task.done() for task in tasks)
    served = [number for number in order if not tasks[number].cancelled()]
    assert sorted(took) == served
    # First come, first served: among those that waited, in the order they came.
    assert took == sorted(took) or size > 1


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 3), STEPS)
def test_slots_never_exceed_their_size_and_never_lose_one(size: int, steps: list[tuple[Any, ...]]) -> None:
    asyncio.run(_run(size, steps, Slots(size)))


def test_a_waiter_cancelled_as_its_slot_was_handed_over_passes_it_on() -> None:
    async def scenario() -> None:
        slots = Slots(1)
        await slots.take()
        first = asyncio.ensure_future(slots.take())
        second = asyncio.ensure_future(slots.take())
        await asyncio.sleep(0)
        slots.give()  # handed to ``first``, which has not resumed yet
        first.cancel()  # its deadline passes in the same turn
        with pytest.raises(asyncio.CancelledError):
            await first
        await second  # the slot went on to the next waiter
        assert slots.free == 0
        slots.give()
        assert slots.free == 1 and not slots.waiters

    asyncio.run(scenario())


class _Leaky(Slots):
    """A mutant: a waiter cancelled after its slot was handed to it keeps the slot."""

    async def take(self) -> None:
        if self.free and not self.waiters:
            self.free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if not waiter.done():
                self.waiters.remove(waiter)
            raise


@pytest.mark.parametrize("mutant", [_Leaky])
def test_a_broken_slots_is_caught(mutant: type[Slots]) -> None:
    from hypothesis import Phase, find

    def caught(drawn: tuple[int, list[tuple[Any, ...]]]) -> bool:
        size, steps = drawn
        try:
            asyncio.run(_run(size, steps, mutant(size)))
        except AssertionError:
            return True
        return False

    find(st.tuples(st.integers(1, 3), STEPS), caught,
         settings=settings(phases=[Phase.generate], max_examples=2000, database=None, deadline=None))
