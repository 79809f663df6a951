"""A service attempt of a Run is a containment owner: the Run is settled or cancelled only
when none of its attempts is open, and no new attempt lands behind that check.

The Run ledger counts a Run's open attempts under the Run's lock; ``AttemptLedger.prepare``
takes the same lock first and the attempt kernel refuses a new attempt for a recorded Run
that is not RUNNING (``run_closed``, RUN_OWNER_MISMATCH), on every database. A prepare
racing a settlement on PostgreSQL therefore either lands first (the settlement raises
RUN_CONTAINMENT_UNPROVEN) or is refused: never a DONE Run with an open attempt.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from adapter_support import kind_of
from attempt_fakes import spec
from run_support import Runs, runs_db, unique  # noqa: F401 (runs_db: fixture)
from tenure.adapters import AttemptLedger, RunLedger
from tenure.adapters.attempts.ledger import attempt_id_for
from tenure.adapters.runs.engine import RunEngine
from tenure.model import TERMINAL_ATTEMPT_STATES, AttemptState, ErrorCode, RunStatus, TenureError, WaitKind


@pytest.fixture
async def ledger(runs_db: str) -> Any:
    async with RunLedger(runs_db) as made:
        yield made


@pytest.fixture
async def attempts(runs_db: str) -> Any:
    async with AttemptLedger(runs_db) as made:
        yield made


@pytest.fixture
def runs(ledger: RunLedger, runs_db: str) -> Runs:
    return Runs(ledger, runs_db)


async def owner_mismatch(call: Any) -> TenureError:
    with pytest.raises(TenureError) as caught:
        await call
    assert caught.value.code is ErrorCode.RUN_OWNER_MISMATCH, caught.value
    return caught.value


async def closed_runs(runs: Runs) -> dict[str, str]:
    """One Run in every status but RUNNING, by status value."""
    ledger = runs.ledger
    found = {"queued": (await runs.admit("closed-queued")).run.run_id}
    done = await runs.running("closed-done")
    assert await ledger.settle(done, 0, RunStatus.DONE)
    failed = await runs.running("closed-failed")
    assert await ledger.settle(failed, 0, RunStatus.FAILED, error="crash")
    cancelling = await runs.running("closed-cancelling")
    assert await ledger.begin_cancel(cancelling) is not None
    cancelled = await runs.running("closed-cancelled")
    assert await ledger.begin_cancel(cancelled) is not None
    assert await ledger.finish_cancel(cancelled, 0, runs.broker)
    hardware = await runs.running("closed-hardware")
    assert await ledger.enter_hardware_wait(hardware, 0)
    waiting, _ = await runs.waiting_on_consent("closed-consent")
    found.update(done=done, failed=failed, cancelling=cancelling, cancelled=cancelled, awaiting_hardware=hardware,
                 awaiting_consent=waiting)
    for status, run_id in found.items():
        assert (await ledger.get(run_id)).status.value == status  # type: ignore[union-attr]
    return found


async def test_an_attempt_is_prepared_for_a_running_run(runs: Runs, attempts: AttemptLedger) -> None:
    run_id = await runs.running("run-1")
    attempt_id = await attempts.prepare(spec(unique("owner"), run_id=run_id))
    record = await attempts.get(attempt_id)
    assert record is not None and (record.run_id, record.state) == (run_id, AttemptState.PREPARED)
    with pytest.raises(TenureError) as caught:
        await runs.ledger.settle(run_id, 0, RunStatus.DONE)
    assert caught.value.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN


async def test_an_attempt_for_a_run_that_is_not_running_is_an_owner_mismatch_and_stores_nothing(
    runs: Runs, attempts: AttemptLedger
) -> None:
    for status, run_id in (await closed_runs(runs)).items():
        before = await runs.ledger.get(run_id)
        request = spec(unique("owner"), run_id=run_id)
        error = await owner_mismatch(attempts.prepare(request))
        assert error.reason == "run_closed", status
        assert run_id not in str(error) and request.owner_job_id not in str(error)
        assert runs.count("tenure_attempts", run_id) == 0, status
        assert await runs.ledger.get(run_id) == before, status


async def test_attempts_without_a_run_of_this_database_are_prepared(runs: Runs, attempts: AttemptLedger) -> None:
    # Attempts are also used on their own, or for Runs kept elsewhere: never refused for it.
    for run_id in (None, runs.run_id("no-such-run"), unique("elsewhere"), "r" * 255):
        attempt_id = await attempts.prepare(spec(unique("owner"), run_id=run_id))
        record = await attempts.get(attempt_id)
        assert record is not None and (record.run_id, record.state) == (run_id, AttemptState.PREPARED)


async def test_a_replay_is_answered_after_the_run_closed_but_a_retry_generation_is_refused(
    runs: Runs, attempts: AttemptLedger
) -> None:
    run_id = await runs.running("run-1")
    owner = unique("owner")
    attempt_id = await attempts.prepare(spec(owner, run_id=run_id))
    assert await attempts.request_cancel(attempt_id)  # never sent: cancelled at once, so contained
    assert await runs.ledger.settle(run_id, 0, RunStatus.DONE)
    assert await attempts.prepare(spec(owner, run_id=run_id)) == attempt_id
    error = await owner_mismatch(attempts.prepare(spec(owner, 2, run_id=run_id)))
    assert error.reason == "run_closed"
    assert runs.count("tenure_attempts", run_id) == 1


async def test_a_parked_run_gets_no_new_attempt_but_resumes_on_the_one_it_waits_for(
    runs: Runs, attempts: AttemptLedger
) -> None:
    run_id = await runs.running("run-1")
    attempt_id = await attempts.prepare(spec(unique("owner"), run_id=run_id))
    assert await runs.ledger.park(run_id, 0, kind=WaitKind.SERVICE, owner_id=attempt_id)
    await owner_mismatch(attempts.prepare(spec(unique("owner"), run_id=run_id)))
    assert await attempts.request_cancel(attempt_id)
    assert await runs.ledger.resume(run_id, owner_id=attempt_id) == 1
    assert runs.count("tenure_attempts", run_id) == 1


INTERLEAVING_DATABASES = pytest.mark.parametrize("runs_db", ["postgresql"], indirect=True)
"""The race tests run where two transactions can interleave. On SQLite they cannot: a
transaction runs in one hop to its connection's thread and writers are serialized
(BEGIN IMMEDIATE), so a prepare and a settlement only ever run one after the other, which
the sequential tests above cover on every database (a prepare after the settlement is
refused, a settlement after the prepare is RUN_CONTAINMENT_UNPROVEN)."""


def _contained(status: RunStatus, attempt: Any) -> bool:
    """No Run ended with an attempt of it still open."""
    return not (status is RunStatus.DONE and attempt is not None and attempt.state not in TERMINAL_ATTEMPT_STATES)


@INTERLEAVING_DATABASES
async def test_a_prepare_meeting_a_settlement_between_its_count_and_its_commit_is_refused(
    runs: Runs, runs_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race's exact interleaving, made certain: another process prepares an attempt for
    the Run after the settlement counted the Run's open attempts and before it commits.
    The settle's transaction path (the decided-ahead settle, one statement, meets the
    same race in tests/adapters/runs/test_run_ahead.py)."""
    assert kind_of(runs_db) == "postgresql"
    run_id = await runs.running("run-1")
    request = spec(unique("owner"), run_id=run_id)
    counted = RunEngine.locked_pair_counting
    prepares: list[asyncio.Future[str]] = []

    async with AttemptLedger(runs_db) as other:
        async def containment(tx: Any, counted_run_id: str, counts: Any) -> Any:
            # The settle locks its pair and counts its containment in one statement.
            result = await counted(tx, counted_run_id, counts)
            prepares.append(asyncio.ensure_future(other.prepare(request)))
            # Long enough for an unfenced prepare to commit; a fenced one waits for the Run's lock.
            await asyncio.wait(prepares, timeout=1.0)
            return result

        monkeypatch.setattr(RunEngine, "locked_pair_counting", staticmethod(containment))
        monkeypatch.setattr(runs.ledger.engine, "send_ahead", _no_ahead)
        settled = await runs.ledger.settle(run_id, 0, RunStatus.DONE)
        monkeypatch.undo()
        outcome: Any
        try:
            outcome = await asyncio.wait_for(prepares[0], 60)
        except TenureError as error:
            outcome = error
        attempt = await other.get(attempt_id_for(request.owner_job_id, request.generation))
    status = (await runs.ledger.get(run_id)).status  # type: ignore[union-attr]
    assert (settled, status) == (True, RunStatus.DONE)
    assert _contained(status, attempt), f"the Run is DONE with an attempt {attempt.state.value}"  # type: ignore[union-attr]
    assert isinstance(outcome, TenureError) and outcome.code is ErrorCode.RUN_OWNER_MISMATCH, outcome
    assert runs.count("tenure_attempts", run_id) == 0


async def _no_ahead(*_: Any) -> None:
    return None


RACE_ROUNDS = 40


@INTERLEAVING_DATABASES
async def test_a_prepare_racing_a_settlement_either_holds_the_settlement_or_is_refused(
    runs: Runs, runs_db: str
) -> None:
    """Settle and prepare at once, on their own connections, round after round (each order
    of starting them): never a DONE Run with an open attempt, and exactly one of them wins."""
    assert kind_of(runs_db) == "postgresql"
    async with RunLedger(runs_db) as settler, AttemptLedger(runs_db) as preparer:
        for round_number in range(RACE_ROUNDS):
            run_id = await runs.running(f"race-{round_number}")
            request = spec(unique("owner"), run_id=run_id)
            calls = [settler.settle(run_id, 0, RunStatus.DONE), preparer.prepare(request)]
            if round_number % 2:
                calls.reverse()
            outcomes = await asyncio.gather(*calls, return_exceptions=True)
            if round_number % 2:
                outcomes.reverse()
            settled, prepared = outcomes
            attempt = await preparer.get(attempt_id_for(request.owner_job_id, request.generation))
            status = (await runs.ledger.get(run_id)).status  # type: ignore[union-attr]
            assert _contained(status, attempt), (
                f"round {round_number}: the Run is DONE with an attempt {attempt.state.value}"  # type: ignore[union-attr]
            )
            if settled is True:
                # Settled first: the prepare saw the Run closed and stored nothing.
                assert isinstance(prepared, TenureError) and prepared.code is ErrorCode.RUN_OWNER_MISMATCH, prepared
                assert status is RunStatus.DONE and attempt is None
            else:
                # The attempt landed first: the settlement counted it and refused.
                assert isinstance(settled, TenureError) and settled.code is ErrorCode.RUN_CONTAINMENT_UNPROVEN, settled
                assert prepared == attempt_id_for(request.owner_job_id, request.generation)
                assert status is RunStatus.RUNNING and attempt is not None and attempt.state is AttemptState.PREPARED
