"""Run commands decided ahead on PostgreSQL (``RunEngine.send_ahead``): one statement locks
the Run and its current delivery, reads the clock after both locks, and writes both only
if both still equal the pair decided on and the clock lies in the decision's window.

Each scenario holds on the engine as built and fails on a broken one: a window taken
from the guards alone (the claim's effect compares the time too: ``updated_at`` never
moves backwards, INV-R9) and a statement that writes without comparing the pair it
decided on (the fence). An admission without the session fence is inserted ahead too:
one statement creates the Run and its delivery, or answers the Run it meets (a replay,
or the refusal the transaction path would decide). SQLite keeps the transaction path (no
decided-ahead writer).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from adapter_support import raw
from run_support import Runs, raises, unique
from statements import count_statements

from tenure.adapters import RunLedger
from tenure.adapters.core import engine as core_engine
from tenure.adapters.postgres import statements
from tenure.adapters.runs.engine import RunEngine
from tenure.kernel.ahead import decide_ahead, decide_windowed
from tenure.kernel.core import Applied
from tenure.kernel.runs.commands import (
    BeginCancel,
    Claim,
    EnterHardwareWait,
    FailHeld,
    LeaveHardwareWait,
    RecordPublished,
    RecordPublishError,
    Release,
)
from tenure.model import DeliveryState, ErrorCode, RunStatus, TenureError

pytestmark = pytest.mark.parametrize("database", ["postgresql"])

MINUTE_US = 60_000_000
"""Both skews below stay well inside the ten minutes a decision made ahead may span."""


@pytest.fixture
async def runs(db_url: str) -> AsyncIterator[Runs]:
    async with RunLedger(db_url) as ledger:
        yield Runs(ledger, db_url)


def _statements_of(ledger: RunLedger) -> list[str]:
    """Every one-statement call the ledger's store sends from now on (its SQL text)."""
    store = ledger.engine.engine.store
    sent: list[str] = []
    fetch_once = store._fetch_once  # type: ignore[attr-defined]  # noqa: SLF001

    async def recorded(pool: Any, deadline: float, sql: str, arguments: list[Any]) -> list[Any]:
        sent.append(sql)
        return await fetch_once(pool, deadline, sql, arguments)

    store._fetch_once = recorded  # type: ignore[attr-defined]  # noqa: SLF001
    return sent


# --- scenarios: what the engine as built does ------------------------------------------------


async def a_claim_keeps_an_updated_at_later_than_its_clock(runs: Runs) -> None:
    """A Run whose ``updated_at`` lies two minutes after the database clock (a writer
    whose clock ran ahead), remembered as such, claimed by an engine whose estimate of
    the database time runs four minutes ahead: the claim decided at that estimate would set
    ``updated_at`` to the clock; the statement's clock lies before the window that
    decision holds for, so the kernel decides again at the real clock, and ``updated_at``
    stays where it was (it never moves backwards)."""
    ledger = runs.ledger
    run_id = await runs.published(unique("window"))
    raw(runs.db_url, "UPDATE tenure_runs SET updated_at = clock_timestamp() + interval '2 minutes' WHERE run_id = ?",
        (run_id,))
    engine: RunEngine = ledger.engine
    planted = await _stored(ledger, run_id)
    engine.engine.remember_parts([(binding, row) for binding, row in _pair_parts(planted)])
    store = engine.engine.store
    estimate = store.estimated_now_us  # type: ignore[attr-defined]
    store.estimated_now_us = lambda: estimate() + 4 * MINUTE_US  # type: ignore[attr-defined]
    try:
        claimed = await ledger.claim(run_id, 0, node="node-a")
    finally:
        del store.estimated_now_us  # type: ignore[attr-defined]
    assert claimed is not None
    after = await _stored(ledger, run_id)
    assert after.run.status is RunStatus.RUNNING and after.current.state is DeliveryState.CLAIMED
    assert after.run.updated_at_us == planted.run.updated_at_us, "updated_at moved backwards"


async def a_claim_from_a_stale_pair_is_refused_where_another_engine_claimed(runs: Runs) -> None:
    """The engine remembers the Run published; another engine (another process) claims
    it; this engine's claim, decided ahead from the pair it remembers, must not write
    over that claim: the statement finds the pair changed and the kernel refuses."""
    ledger = runs.ledger
    run_id = await runs.published(unique("fence"))
    assert ledger.engine.last_pair(run_id) is not None, "the published pair is remembered"
    async with RunLedger(runs.db_url) as other:
        assert await other.claim(run_id, 0, node="node-b") is not None
    assert await ledger.claim(run_id, 0, node="node-a") is None, "claimed over another engine's claim"
    delivery = (await _stored(ledger, run_id)).current
    assert delivery.state is DeliveryState.CLAIMED and delivery.claimed_by == "node-b"


def _pair_parts(pair: Any) -> list[tuple[Any, Any]]:
    from tenure.adapters.runs.engine import _parts

    return list(_parts(pair))


Scenario = Callable[[Runs], Awaitable[None]]


# --- breakages ----------------------------------------------------------------------------------


def _guards_alone(decider: Callable[..., Any]) -> Callable[..., Any]:
    """``decider`` (decide_windowed or decide_ahead) with the window the guards imply,
    ignoring the effect's own comparison with the time (the claim's ``updated_at`` never
    moving backwards)."""
    def broken(*args: Any, **kwargs: Any) -> Any:
        ahead = decider(*args, **kwargs)
        if ahead is None:
            return None
        return dataclasses.replace(ahead, not_before_us=ahead.rule_not_before_us, not_after_us=ahead.rule_not_after_us)

    return broken


def _window_from_the_guards_alone(patch: pytest.MonkeyPatch) -> None:
    # Both deciders the engine asks (the declared one first, the instrumented reference
    # for what the declarations do not cover).
    patch.setattr(core_engine, "decide_windowed", _guards_alone(decide_windowed))
    patch.setattr(core_engine, "decide_ahead", _guards_alone(decide_ahead))


def _written_without_the_fence(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "PAIR_UNCHANGED", "true")
    statements.clear_statement_cache()


BREAKAGES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Scenario, str]] = {
    "the_window_from_the_guards_alone": (_window_from_the_guards_alone, a_claim_keeps_an_updated_at_later_than_its_clock,
                                         "updated_at moved backwards"),
    "written_without_the_fence": (_written_without_the_fence,
                                  a_claim_from_a_stale_pair_is_refused_where_another_engine_claimed,
                                  "claimed over another engine's claim"),
}
"""Each breakage, the scenario that catches it, and what that scenario's failure says."""


@contextlib.contextmanager
def _broken(name: str) -> Iterator[Scenario]:
    breakage, scenario, _ = BREAKAGES[name]
    try:
        with pytest.MonkeyPatch.context() as patch:
            breakage(patch)
            yield scenario
    finally:
        statements.clear_statement_cache()


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_scenario_holds_on_the_run_engine_as_built(runs: Runs, name: str) -> None:
    await BREAKAGES[name][1](runs)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_broken_decided_ahead_run_engine_is_caught_by_its_scenario(runs: Runs, name: str) -> None:
    with _broken(name) as scenario, pytest.raises(AssertionError, match=BREAKAGES[name][2]):
        await scenario(runs)


async def test_a_claim_from_the_pair_last_seen_is_one_statement_and_writes_what_the_transaction_path_writes(
    runs: Runs,
) -> None:
    ledger = runs.ledger
    ahead_id, reference_id = await runs.published(unique("ahead")), await runs.published(unique("reference"))
    sent = _statements_of(ledger)
    assert await ledger.claim(ahead_id, 0, node="node-a") is not None
    assert len(sent) == 1, "one statement: lock, clock, verdict, both writes"
    engine = ledger.engine
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(engine, "send_ahead", _no_ahead)
        assert await ledger.claim(reference_id, 0, node="node-a") is not None
    assert len(sent) == 1, "the reference claim ran in a transaction"
    ahead, reference = await _stored(ledger, ahead_id), await _stored(ledger, reference_id)
    assert _shape(ahead) == _shape(reference)


async def _no_ahead(*_: Any) -> None:
    return None


async def _stored(ledger: RunLedger, run_id: str) -> Any:
    """The Run and its current delivery as stored (the kernel's rows)."""
    engine: RunEngine = ledger.engine
    pair = await engine.read(lambda tx: engine.read_pair(tx, run_id))
    assert pair is not None
    return pair


def _shape(pair: Any) -> tuple[Any, ...]:
    """What a claim decides, without the Run's identity and times."""
    run, delivery = pair.run, pair.current
    return (run.status, run.enqueue_seq, run.node, run.started_at_us == run.updated_at_us == delivery.claimed_at_us,
            delivery.state, delivery.claimed_by, delivery.settled_at_us)


# --- admission decided ahead ------------------------------------------------------------------


async def test_an_admission_is_one_statement_and_its_replay_one_more(runs: Runs) -> None:
    await runs.admit("warm")  # the store's first call reads its catalog and the database clock
    with count_statements() as counted:
        first = await runs.admit("once")
        assert counted.total == 1, counted.texts
        again = await runs.admit("once")
        assert counted.total == 2, counted.texts
    assert first.created and not again.created
    assert again.run.run_id == first.run.run_id and again.delivery == first.delivery


async def test_a_changed_intent_under_an_admitted_key_is_refused_in_one_statement(runs: Runs) -> None:
    await runs.admit("changed")
    with count_statements() as counted:
        error = await raises(ErrorCode.RUN_ADMISSION_CONFLICT,
                             runs.admit("changed", intent=runs.intent(payload={"task": "another"})))
    assert error.reason == "intent_changed" and counted.total == 1, counted.texts


async def test_racing_admissions_under_one_key_create_one_run_and_replay_it(runs: Runs) -> None:
    # Each racer's statement may miss a row another inserts meanwhile (its snapshot began
    # first): that insert then writes nothing and the racer takes the transaction path,
    # which waits on the named lock and replays.
    admissions = await asyncio.gather(*(runs.admit("raced") for _ in range(8)))
    assert sum(admission.created for admission in admissions) == 1
    assert len({admission.run.run_id for admission in admissions}) == 1


async def test_a_session_fenced_admission_keeps_the_transaction(runs: Runs) -> None:
    await runs.admit("warm")
    with count_statements() as counted:
        admission = await runs.admit("fenced", intent=runs.intent(session_id=unique("session")), session_fence=True)
    assert admission.created and counted.texts[0] == "BEGIN", counted.texts


# --- the decided-ahead path and the transaction path decide alike -------------------------------

MAKERS: tuple[Callable[[int], Any], ...] = (
    lambda seq: Release(enqueue_seq=seq),
    lambda seq: FailHeld(enqueue_seq=seq, error="gave_up"),
    lambda seq: RecordPublished(enqueue_seq=seq),
    lambda seq: RecordPublishError(enqueue_seq=seq, error="publish_failed:Timeout"),
    lambda seq: Claim(enqueue_seq=seq, node="node-a"),
    lambda seq: Claim(enqueue_seq=seq, node="node-b", claimant="hop-1"),
    lambda seq: EnterHardwareWait(enqueue_seq=seq),
    lambda seq: LeaveHardwareWait(enqueue_seq=seq),
    lambda seq: BeginCancel(),
)
"""Every command the declaration decides ahead, for a sequence drawn by the stream."""


async def _sent(engine: RunEngine, run_id: str, command: Any) -> Any:
    """What a send answers, comparable across Runs: the reply or the refusal, or the
    error's code (the decided pairs are compared as stored, by :func:`_normal`)."""
    try:
        decision = (await engine.send(run_id, command)).decision
    except TenureError as error:
        return error.code, error.reason
    return decision.reply if isinstance(decision, Applied) else decision


def _normal(pair: Any) -> tuple[Any, ...]:
    """A stored pair without its Run's identity and times (two Runs compared)."""
    run, delivery = pair.run, pair.current
    return (run.status, run.enqueue_seq, run.node, run.error, run.owner_kind, run.started_at_us is None,
            run.updated_at_us >= run.created_at_us, delivery.state, delivery.publish_attempts, delivery.last_error,
            delivery.claimed_by, delivery.published_at_us is None, delivery.claimed_at_us is None)


async def test_random_command_streams_decide_alike_ahead_and_in_a_transaction(runs: Runs) -> None:
    # Two Runs admitted alike get the same random stream, one through the engine that
    # decides ahead, one through an engine held to the transaction path; a third engine
    # (another process) sometimes writes both first, so the first engine's memory is stale:
    # its statement answers the rows, and the kernel decides again from them.
    rng = random.Random(49)
    ahead = runs.ledger.engine
    statements_per_send: list[int] = []
    store = ahead.engine.store
    joined_ahead = store.joined_ahead  # type: ignore[attr-defined]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        statements_per_send[-1] += 1
        return await joined_ahead(*args, **kwargs)

    store.joined_ahead = counted  # type: ignore[attr-defined]
    async with RunLedger(runs.db_url) as reference_ledger, RunLedger(runs.db_url) as other_ledger:
        reference, other = reference_ledger.engine, other_ledger.engine
        reference.send_ahead = _no_ahead  # type: ignore[method-assign]
        for stream in range(6):
            hold = rng.random() < 0.4
            fast = (await runs.admit(f"fast-{stream}", hold=hold)).run.run_id
            slow = (await runs.admit(f"slow-{stream}", hold=hold)).run.run_id
            for _ in range(10):
                command = rng.choice(MAKERS)(rng.choice((0, 0, 0, 1)))
                if rng.random() < 0.25:  # another writer first: a publish error counted (or refused alike)
                    meddling = RecordPublishError(enqueue_seq=0, error="publish_failed:Reset")
                    assert await _sent(other, fast, meddling) == await _sent(other, slow, meddling)
                statements_per_send.append(0)
                assert await _sent(ahead, fast, command) == await _sent(reference, slow, command), command
                assert _normal(await _stored(runs.ledger, fast)) == _normal(await _stored(runs.ledger, slow)), command
    del store.joined_ahead  # type: ignore[attr-defined]
    assert 1 in statements_per_send and 2 in statements_per_send, "the fast path and the stale read both ran"
