"""The Run engine's two paths on PostgreSQL, each reached on purpose: a command decided
ahead (one statement, from the pair last seen) and a command the statement cannot
decide, which falls back to the transaction path (the reference).

Each scenario holds on the engine as built and fails on a broken one: an engine that
never decides ahead (every answer is still the reference's: only the path shows it), and
one that never falls back (it takes "not decided ahead" for a refusal). The Run lockstep
catches both too (``test_lockstep_runs.BROKEN_PATHS``), from the paths it counts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from run_support import Runs, broken, unique

from tenure.adapters import RunLedger
from tenure.adapters.runs.engine import AHEAD, FALLBACK, NO_INPUTS, Inputs, RunEngine, Sent
from tenure.conformance.lockstep import raw
from tenure.kernel.core import Refused
from tenure.kernel.runs.aggregate import DECIDED_AHEAD
from tenure.kernel.runs.commands import Claim, Park, Resume
from tenure.kernel.runs.machine import RunRefusal
from tenure.model import WaitKind

pytestmark = pytest.mark.parametrize("database", ["postgresql"])


@pytest.fixture
async def runs(db_url: str) -> AsyncIterator[Runs]:
    async with RunLedger(db_url) as ledger:
        yield Runs(ledger, db_url)


def _paths_of(engine: RunEngine) -> list[tuple[str, str]]:
    """Every (command kind, engine path) the engine reports from now on."""
    taken: list[tuple[str, str]] = []
    engine.path_observer = lambda kind, path: taken.append((kind.value, path))
    return taken


# --- scenarios: what the engine as built does ------------------------------------------------


async def a_claim_from_the_pair_last_seen_is_decided_ahead(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.published(unique("ahead"))
    taken = _paths_of(ledger.engine)
    assert await ledger.claim(run_id, 0, node="node-a") is not None
    assert taken == [("claim", AHEAD)], "not decided ahead"


async def a_claim_behind_a_rotation_falls_back_and_applies(runs: Runs) -> None:
    """Another session claims the Run's hop, parks it on a timer due at once and resumes
    it (the next hop opened) in one transaction, held open until this engine's claim of
    the new hop waits on the Run's lock: the claim's statement cannot see the new
    delivery (its snapshot predates the commit), so the claim falls back to the
    transaction, which sees it and claims."""
    ledger = runs.ledger
    run_id = await runs.published(unique("rotation"))
    taken = _paths_of(ledger.engine)
    park = Park(enqueue_seq=0, wait=WaitKind.TIMER, owner_id="nap", owner=None)
    steps = ((Claim(enqueue_seq=0, node="node-b"), NO_INPUTS), (park, Inputs(delay_us=0)),
             (Resume(owner_id="nap", owner=None), NO_INPUTS))
    async with RunLedger(runs.db_url) as other:
        async def rotate(connection: Any) -> None:
            async with other.store.borrowed(connection) as tx:
                for command, inputs in steps:
                    assert (await other.engine.send_in(tx, run_id, command, inputs)).applied

        holder = await raw.connect(runs.db_url)
        try:
            held, claimed, waited = await raw.holding_open(holder, runs.db_url, rotate,
                                                           lambda: ledger.claim(run_id, 1, node="node-a"))
        finally:
            await holder.close()
    assert held[0] == "ok" and waited, (held, waited)
    assert claimed[0] == "ok" and claimed[1] is not None, "the claim behind a rotation was refused"
    assert taken == [("claim", FALLBACK)], taken


Scenario = Callable[[Runs], Awaitable[None]]


# --- breakages ----------------------------------------------------------------------------------


async def _never_ahead(self: RunEngine, run_id: str, command: Any) -> Sent | None:
    return None


def _never_decides_ahead(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(RunEngine, "send_ahead", _never_ahead)


def _never_falls_back(patch: pytest.MonkeyPatch) -> None:
    """A command on the pair that the statement could not decide is answered as refused
    (a stale hop), never sent to the transaction path (an admission still falls back:
    the first one of a fresh engine always does, before it has seen the clock)."""
    send_ahead = RunEngine.send_ahead

    async def refused_instead(self: RunEngine, run_id: str, command: Any) -> Sent | None:
        sent = await send_ahead(self, run_id, command)
        if sent is None and command.kind in DECIDED_AHEAD:
            return Sent(Refused(RunRefusal.STALE_HOP), ())
        return sent

    patch.setattr(RunEngine, "send_ahead", refused_instead)


BREAKAGES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Scenario, str]] = {
    "the_engine_never_decides_ahead": (_never_decides_ahead, a_claim_from_the_pair_last_seen_is_decided_ahead,
                                       "not decided ahead"),
    "the_engine_never_falls_back": (_never_falls_back, a_claim_behind_a_rotation_falls_back_and_applies,
                                    "the claim behind a rotation was refused"),
}
"""Each breakage, the scenario that catches it, and what that scenario's failure says."""


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_scenario_holds_on_the_run_engine_as_built(runs: Runs, name: str) -> None:
    await BREAKAGES[name][1](runs)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_engine_that_never_takes_one_of_its_paths_is_caught_by_its_scenario(runs: Runs, name: str) -> None:
    breakage, scenario, message = BREAKAGES[name]
    with broken(breakage), pytest.raises(AssertionError, match=message):
        await scenario(runs)
