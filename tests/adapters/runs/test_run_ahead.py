"""Run commands decided ahead on PostgreSQL (``RunEngine.send_ahead``): one statement locks
the Run and its current delivery, reads the clock after both locks, and writes both only
if both still equal the pair decided on and the clock lies in the decision's window.

Each scenario holds on the engine as built and fails on a broken one: a window taken
from the guards alone (the claim's effect compares the time too: ``updated_at`` never
moves backwards, INV-R9) and a statement that writes without comparing the pair it
decided on (the fence). An admission without the session fence is inserted ahead too:
one statement creates the Run and its delivery, or answers the Run it meets (a replay,
or the refusal the transaction path would decide). A hop's settle is decided ahead on
the counts it reads (``COUNTED_AHEAD``: every effect contained, no consent pending): one
statement locks the pair, counts after the locks, and writes the pair and deletes the
checkpoint only where the pair, every count and the window hold and the Run it locked is
the version its snapshot counted in; its breakages (the counts not compared, the
snapshot not checked, an owner's opening that locks the Run without writing it) are
caught by their scenarios too. A publication asks the kernel on the pair last seen
instead of reading it: a stale pair calls the broker for a hop whose acknowledgement is
then refused on the rows as locked (a breakage that writes it without the fence is
caught), and a refusal on a stale pair reads the pair before answering. SQLite keeps the
transaction path (no decided-ahead writer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from adapter_support import raw
from polling import until
from run_support import Runs, broken, raises, succeeded, unique
from statements import count_statements

from tenure.adapters import RunLedger
from tenure.adapters.core.engine import deciders
from tenure.adapters.postgres import statements
from tenure.adapters.runs.checkpoints import RecordedOutcome
from tenure.adapters.runs.engine import RunEngine
from tenure.kernel.ahead import decide_ahead, decide_windowed
from tenure.kernel.core import Applied
from tenure.kernel.runs.finders import OPEN_JOB_STATUSES
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
from tenure.model import ConsentStatus, DeliveryState, ErrorCode, RunStatus, TenureError, WaitKind, hop_key

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


DONE_AT_0 = RecordedOutcome(0, RunStatus.DONE, None, None)


async def _settled(engine: RunEngine, run_id: str, outcome: RecordedOutcome = DONE_AT_0, *,
                   record: bool = False) -> Any:
    """What a settle answers: True or False, or the error's code."""
    try:
        return await engine.settle(run_id, outcome, record=record)
    except TenureError as error:
        return error.code


async def a_settle_with_an_open_job_is_refused(runs: Runs) -> None:
    """The engine remembers the pair its claim wrote; a delegated job of the hop is still
    open (its submit writes nothing the pair shows): the settle decided ahead on no open
    job must not write, and the transaction path refuses it."""
    ledger = runs.ledger
    run_id = await runs.running(unique("open-job"))
    await runs.job(run_id)
    assert ledger.engine.last_pair(run_id) is not None, "the claimed pair is remembered"
    assert await _settled(ledger.engine, run_id) is ErrorCode.RUN_CONTAINMENT_UNPROVEN, "settled with an open job"
    assert (await _stored(ledger, run_id)).run.status is RunStatus.RUNNING


async def a_settle_from_a_stale_pair_is_refused_where_another_engine_cancelled(runs: Runs) -> None:
    """The engine remembers the Run running; another engine begins its cancellation; the
    settle decided ahead from the pair remembered must not write over it."""
    ledger = runs.ledger
    run_id = await runs.running(unique("cancelled"))
    async with RunLedger(runs.db_url) as other:
        await other.begin_cancel(run_id)
    answered = await _settled(ledger.engine, run_id)
    assert (await _stored(ledger, run_id)).run.status is RunStatus.CANCELLING, "settled over another engine's cancel"
    assert answered is not True


async def a_settle_waiting_for_an_owners_opening_sees_the_job_it_opened(runs: Runs) -> None:
    """Another process submits a delegated job of the running hop and holds its
    transaction open (the Run locked, the job inserted) until the settle's statement
    waits for the Run's lock; then it commits. That statement's snapshot predates the
    job: it must not settle on it (the Run it locks is newer than its snapshot), and the
    transaction path, counting after the lock, refuses."""
    ledger = runs.ledger
    run_id = await runs.running(unique("opening"))
    assert ledger.engine.last_pair(run_id) is not None
    opened, release = asyncio.Event(), asyncio.Event()
    async with RunLedger(runs.db_url) as other:
        core = other.engine.engine
        decide_one = core.decide_one

        async def held_open(*args: Any, **kwargs: Any) -> Any:
            decision = await decide_one(*args, **kwargs)  # the job inserted, not committed
            opened.set()
            await release.wait()
            return decision

        core.decide_one = held_open  # type: ignore[method-assign]
        submit = asyncio.ensure_future(other.jobs.submit(run_id, request_id=unique("request"), runtime="sandbox",
                                                         profile="small", request={}))
        await asyncio.wait_for(opened.wait(), 60)  # a hang guard
        settle = asyncio.ensure_future(_settled(ledger.engine, run_id))
        watcher = await asyncpg.connect(runs.db_url)
        try:
            async def waits_for_the_run() -> bool:
                return bool(await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"))

            await until(waits_for_the_run, what="the settle's statement waits for the Run's lock")  # a hang guard
        finally:
            await watcher.close()
        release.set()
        await submit
        answered = await settle
    assert (await _stored(ledger, run_id)).run.status is RunStatus.RUNNING, (
        "settled beside a job an owner's opening committed meanwhile")
    assert answered is ErrorCode.RUN_CONTAINMENT_UNPROVEN


async def a_publication_from_a_stale_pair_records_nothing_where_another_engine_cancelled(runs: Runs) -> None:
    """The engine remembers the Run its admission inserted (QUEUED, delivery PENDING);
    another engine cancels it to the end. The publication asks the kernel on the pair
    remembered (no read), so the broker is called for the hop; its ``RECORD_PUBLISHED``,
    decided ahead from that same pair, must not write over the cancellation: the
    statement finds the pair changed and the kernel refuses on the rows it locked. The
    answer and the rows equal the read path's (a Run admitted alike, published by an
    engine that remembers nothing); the job left at the broker is a hop the claim refuses
    as stale, as after a republication."""
    ledger = runs.ledger
    stale = (await runs.admit(unique("stale"))).run.run_id
    reference = (await runs.admit(unique("read"))).run.run_id
    assert ledger.engine.last_pair(stale) is not None, "the admitted pair is remembered"
    async with RunLedger(runs.db_url) as other:
        for run_id in (stale, reference):
            ticket = await other.begin_cancel(run_id)
            assert ticket is not None and await other.finish_cancel(run_id, ticket.enqueue_seq, runs.broker)
    published = await ledger.publish(stale, 0, runs.broker)
    assert (await _stored(ledger, stale)).run.status is RunStatus.CANCELLED, "recorded over another engine's cancel"
    assert published is False
    assert hop_key(stale, 0) in runs.broker.jobs, "the broker was asked on the pair remembered, without a read"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger.engine, "last_pair", lambda run_id: None)
        assert await ledger.publish(reference, 0, runs.broker) is False
    assert hop_key(reference, 0) not in runs.broker.jobs, "the read path sends nothing"
    assert _normal(await _stored(ledger, stale)) == _normal(await _stored(ledger, reference))
    assert await ledger.claim(stale, 0, node="node-a") is None, "the stale hop is refused by its claim"


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
    patch.setattr(deciders, "decide_windowed", _guards_alone(decide_windowed))
    patch.setattr(deciders, "decide_ahead", _guards_alone(decide_ahead))


def _written_without_the_fence(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "PAIR_UNCHANGED", "true")
    statements.clear_statement_cache()


def _counts_not_compared(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "COUNTS_UNCHANGED", "true")
    statements.clear_statement_cache()


def _snapshot_not_checked(patch: pytest.MonkeyPatch) -> None:
    patch.setattr(statements, "SNAPSHOT_SEES_LOCKED", "true")
    statements.clear_statement_cache()


def _openings_lock_without_writing(patch: pytest.MonkeyPatch) -> None:
    # An owner's opening locks the Run as any read does (FOR UPDATE): nothing a later
    # statement can see.
    patch.setattr(statements, "touching", lambda binding, select, schema: statements.with_clock(select))


BREAKAGES: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], Scenario, str]] = {
    "the_window_from_the_guards_alone": (_window_from_the_guards_alone, a_claim_keeps_an_updated_at_later_than_its_clock,
                                         "updated_at moved backwards"),
    "written_without_the_fence": (_written_without_the_fence,
                                  a_claim_from_a_stale_pair_is_refused_where_another_engine_claimed,
                                  "claimed over another engine's claim"),
    "a_publication_recorded_without_the_fence": (
        _written_without_the_fence, a_publication_from_a_stale_pair_records_nothing_where_another_engine_cancelled,
        "recorded over another engine's cancel"),
    "a_settle_written_without_the_fence": (_written_without_the_fence,
                                           a_settle_from_a_stale_pair_is_refused_where_another_engine_cancelled,
                                           "settled over another engine's cancel"),
    "a_settle_ignoring_the_counts": (_counts_not_compared, a_settle_with_an_open_job_is_refused,
                                     "settled with an open job"),
    "a_settle_counting_in_a_stale_snapshot": (_snapshot_not_checked,
                                              a_settle_waiting_for_an_owners_opening_sees_the_job_it_opened,
                                              "settled beside a job an owner's opening committed meanwhile"),
    "an_opening_that_locks_the_run_without_writing_it": (
        _openings_lock_without_writing, a_settle_waiting_for_an_owners_opening_sees_the_job_it_opened,
        "settled beside a job an owner's opening committed meanwhile"),
}
"""Each breakage, the scenario that catches it, and what that scenario's failure says."""


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_scenario_holds_on_the_run_engine_as_built(runs: Runs, name: str) -> None:
    await BREAKAGES[name][1](runs)


@pytest.mark.parametrize("name", sorted(BREAKAGES))
async def test_each_broken_decided_ahead_run_engine_is_caught_by_its_scenario(runs: Runs, name: str) -> None:
    breakage, scenario, message = BREAKAGES[name]
    with broken(breakage, after=statements.clear_statement_cache), pytest.raises(AssertionError, match=message):
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


# --- the publication asked of the pair last seen ------------------------------------------------


async def test_a_publication_from_the_pair_its_admission_remembered_is_one_statement_and_records_what_the_read_path_records(
    runs: Runs,
) -> None:
    ledger = runs.ledger
    ahead_id, reference_id = (await runs.admit(unique("ahead"))).run.run_id, (await runs.admit(unique("read"))).run.run_id
    with count_statements() as counted:
        assert await ledger.publish(ahead_id, 0, runs.broker)
    assert counted.total == 1, counted.texts
    with pytest.MonkeyPatch.context() as patch, count_statements() as counted:
        patch.setattr(ledger.engine, "last_pair", lambda run_id: None)
        assert await ledger.publish(reference_id, 0, runs.broker)
    assert counted.total > 1, "the reference publication read the pair first"
    assert _normal(await _stored(ledger, ahead_id)) == _normal(await _stored(ledger, reference_id))


async def test_a_publication_the_remembered_pair_refuses_reads_the_pair_where_another_engine_moved_the_run_on(
    runs: Runs,
) -> None:
    """The engine remembers the Run running its hop 0 (it claimed it); another engine
    parks it on a consent, decides the consent and resumes the Run at hop 1. Asked of the
    pair remembered, the kernel refuses hop 1; that refusal proves nothing (the pair is
    stale), so the pair is read and the hop published."""
    ledger = runs.ledger
    run_id = await runs.running(unique("moved-on"))
    assert ledger.engine.last_pair(run_id) is not None, "the claimed pair is remembered"
    async with RunLedger(runs.db_url) as other:
        consent = await other.consents.create(run_id, tool_name="mail.send", tool_call_id=unique("call"),
                                              payload={"to": "bob"})
        assert await other.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
        assert await other.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="bob")
        assert await other.resume(run_id, owner_id=consent.consent_id) == 1
    assert await ledger.publish(run_id, 1, runs.broker), "a stale pair's refusal was taken for the Run's"
    assert hop_key(run_id, 1) in runs.broker.jobs
    stored = await _stored(ledger, run_id)
    assert (stored.run.enqueue_seq, stored.current.state) == (1, DeliveryState.PUBLISHED)


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


# --- the settle decided ahead ------------------------------------------------------------------


async def test_a_settle_from_the_pair_last_seen_is_one_statement_and_writes_what_the_transaction_path_writes(
    runs: Runs,
) -> None:
    ledger = runs.ledger
    ahead_id, reference_id = await runs.running(unique("ahead")), await runs.running(unique("reference"))
    for run_id in (ahead_id, reference_id):
        assert await ledger.checkpoints.save(run_id, 0, state={"step": 1})
    outcome = RecordedOutcome(0, RunStatus.DONE, '{"answer":7}', None)
    with count_statements() as counted:
        assert await ledger.engine.settle(ahead_id, outcome, record=True)
    assert counted.total == 1, counted.texts
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ledger.engine, "send_ahead", _no_ahead)
        assert await ledger.engine.settle(reference_id, outcome, record=True)
    for run_id in (ahead_id, reference_id):
        assert await ledger.checkpoints.load(run_id) is None, "the settled Run's checkpoint is deleted"
    ahead, reference = await _stored(ledger, ahead_id), await _stored(ledger, reference_id)
    assert _normal(ahead) == _normal(reference)
    assert ahead.run.result_json == reference.run.result_json == '{"answer":7}'
    assert ahead.run.updated_at_us == ahead.current.settled_at_us, "one clock, read after both locks"


async def test_a_settle_with_a_pending_consent_keeps_the_transaction_and_sweeps_it(runs: Runs) -> None:
    ledger = runs.ledger
    run_id = await runs.running(unique("consent"))
    consent_id = await runs.consent(run_id)
    with count_statements() as counted:
        assert await ledger.engine.settle(run_id, DONE_AT_0)
    assert "BEGIN" in counted.texts, counted.texts
    consent = await ledger.consents.get(consent_id)
    assert consent is not None and consent.status is ConsentStatus.CANCELLED


async def _stream_step(rng: random.Random, runs: Runs, other: RunLedger, engines: tuple[RunEngine, RunEngine],
                       pair: tuple[str, str], jobs: dict[str, list[str]]) -> tuple[Any, Any]:
    """One random step on both Runs: a Run command, a settle (with or without its outcome
    recorded on refusal), or another process opening or closing an owner of the Run."""
    ahead, reference = engines
    roll = rng.random()
    if roll < 0.15:  # another process opens a delegated job of each Run (refused alike when not running)
        async def submit(run_id: str) -> Any:
            try:
                job = await other.jobs.submit(run_id, request_id=unique("request"), runtime="sandbox",
                                              profile="small", request={})
            except TenureError as error:
                return error.code
            jobs[run_id].append(job.job_id)
            return "opened"
        return await submit(pair[0]), await submit(pair[1])
    if roll < 0.25:  # another process ends each Run's oldest open job
        async def close(run_id: str) -> Any:
            return bool(jobs[run_id]) and await other.jobs.adopt_result(jobs[run_id][0], succeeded(jobs[run_id].pop(0)))
        return await close(pair[0]), await close(pair[1])
    if roll < 0.55:
        status = rng.choice((RunStatus.DONE, RunStatus.FAILED))
        outcome = RecordedOutcome(rng.choice((0, 0, 0, 1)), status, '{"n":1}' if status is RunStatus.DONE else None,
                                  "workflow_error:x" if status is RunStatus.FAILED else None)
        record = rng.random() < 0.5
        return (await _settled(ahead, pair[0], outcome, record=record),
                await _settled(reference, pair[1], outcome, record=record))
    command = rng.choice(MAKERS)(rng.choice((0, 0, 0, 1)))
    return await _sent(ahead, pair[0], command), await _sent(reference, pair[1], command)


async def _aggregate(runs: Runs, run_id: str) -> tuple[Any, ...]:
    """What a settle decides beside the pair: the outcome recorded, whether a checkpoint
    row is left, how many jobs stay open."""
    ledger = runs.ledger
    return (_normal(await _stored(ledger, run_id)), await ledger.checkpoints.outcome(run_id),
            runs.count("tenure_run_checkpoints", run_id),
            sum(status in OPEN for (status,) in raw(runs.db_url, "SELECT status FROM tenure_agent_jobs WHERE run_id = ?",
                                                      (run_id,))))


OPEN = frozenset(status.value for status in OPEN_JOB_STATUSES)


async def test_random_streams_with_settles_decide_alike_ahead_and_in_a_transaction(runs: Runs) -> None:
    # As the stream above, with settles (decided ahead on the counts the declaration names)
    # and another process opening and ending delegated jobs of the Runs: the engine that
    # decides ahead and the one held to the transaction path answer alike and leave the
    # same pair, outcome, checkpoint and open jobs; both the one-statement settle and its
    # fallback ran.
    rng = random.Random(4903)
    ahead = runs.ledger.engine
    settle_statements: list[int] = []
    settle = ahead.settle

    async def counted_settle(*args: Any, **kwargs: Any) -> Any:
        with count_statements() as counted:
            try:
                return await settle(*args, **kwargs)
            finally:
                settle_statements.append(counted.total)

    ahead.settle = counted_settle  # type: ignore[method-assign]
    async with RunLedger(runs.db_url) as reference_ledger, RunLedger(runs.db_url) as other:
        reference = reference_ledger.engine
        reference.send_ahead = _no_ahead  # type: ignore[method-assign]
        for stream in range(8):
            fast = await runs.running(f"settle-fast-{stream}")
            slow = await runs.running(f"settle-slow-{stream}")
            jobs: dict[str, list[str]] = {fast: [], slow: []}
            if rng.random() < 0.5:
                for run_id in (fast, slow):
                    assert await runs.ledger.checkpoints.save(run_id, 0, state={"stream": stream})
            for _ in range(12):
                answers = await _stream_step(rng, runs, other, (ahead, reference), (fast, slow), jobs)
                assert answers[0] == answers[1], answers
                assert await _aggregate(runs, fast) == await _aggregate(runs, slow)
    del ahead.settle
    assert 1 in settle_statements and any(count > 1 for count in settle_statements), settle_statements
