"""The attempt runner against fake providers, on every database: it settles what it can,
never fabricates a failure, never repeats an unproven effect; and after the process dies
at any await point of ``run``, a fresh ledger and ``reconcile_unresolved`` (then a
restarted ``run``) reach a state the kernel allows with at most one effect per attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from attempt_fakes import FakeProvider, ProcessDied, spec
from tenure.adapters import AttemptLedger, AttemptRunner
from tenure.model import AttemptState, ErrorCode, TenureError

LEASE_S = 0.05


def runner(ledger: Any, fake: FakeProvider) -> AttemptRunner:
    return AttemptRunner(ledger, fake, poll_interval_s=0, submit_lease_seconds=LEASE_S)


@pytest.mark.parametrize("kind", ["replay", "lookup_only", "neither"])
async def test_an_honest_provider_takes_the_attempt_to_succeeded_with_one_effect(db_url: str, kind: str) -> None:
    fake = FakeProvider(kind)
    async with AttemptLedger(db_url) as ledger:
        attempt_id = await ledger.prepare(spec(kind=kind))
        record = await runner(ledger, fake).run(attempt_id)
    assert record.state is AttemptState.SUCCEEDED and record.result_refs == (f"ref:{record.provider_job_id}",)
    assert list(fake.effects.values()) == [1]


async def test_a_definite_rejection_fails_and_any_other_driver_error_is_indeterminate(db_url: str) -> None:
    async with AttemptLedger(db_url) as ledger:
        rejected = await ledger.prepare(spec("owner-r", kind="lookup_only"))
        assert (await runner(ledger, FakeProvider("lookup_only", plan=["reject"])).run(rejected)).state is AttemptState.FAILED
        for number, step in enumerate(["timeout_after_effect", "error_before_effect"]):
            attempt_id = await ledger.prepare(spec(f"owner-{number}", kind="neither"))
            record = await runner(ledger, FakeProvider("neither", plan=[step])).run(attempt_id)
            assert record.state is AttemptState.INDETERMINATE, step
            assert record.evidence[-1].startswith("ambiguous:driver_raised:")


async def test_a_lost_acknowledgement_on_a_lookup_provider_is_found_again_never_resent(db_url: str) -> None:
    fake = FakeProvider("lookup_only", plan=["timeout_after_effect"])
    async with AttemptLedger(db_url) as ledger:
        attempt_id = await ledger.prepare(spec(kind="lookup_only"))
        first = await runner(ledger, fake).run(attempt_id)
        assert first.state is AttemptState.INDETERMINATE
        settled = await runner(ledger, fake).run(attempt_id)
    assert settled.state is AttemptState.SUCCEEDED and fake.effects[first.idempotency_key] == 1


async def test_a_lying_provider_is_caught_by_the_identity_it_first_recorded(db_url: str) -> None:
    fake = FakeProvider("lying")
    async with AttemptLedger(db_url) as ledger:
        attempt_id = await ledger.prepare(spec(kind="lying"))
        attempt = await ledger.get(attempt_id)
        assert attempt is not None
        # Recorded: the original job. Then an ambiguous poll, and the same-key binding resends.
        granted = await ledger.begin_submit(attempt_id, egress=await _egress())
        assert granted is not None
        original = await fake.submit(granted)
        assert await ledger.record_accepted(attempt_id, provider_job_id=original)
        assert await ledger.record_ambiguous(attempt_id, reason="poll timed out")
        fake.plan = ["ok"]
        with pytest.raises(TenureError) as caught:
            await AttemptRunner(ledger, _Blind(fake), poll_interval_s=0, submit_lease_seconds=LEASE_S).run(attempt_id)
        assert caught.value.code is ErrorCode.ATTEMPT_IDENTITY_CONFLICT
        record = await ledger.get(attempt_id)
    assert record is not None and record.provider_job_id == original and record.state is not AttemptState.SUCCEEDED


class _Blind:
    """A driver whose polls fail (so the runner resends on the same-key binding)."""

    def __init__(self, fake: FakeProvider) -> None:
        self.fake = fake

    async def submit(self, transmission: Any) -> str:
        return await self.fake.submit(transmission)

    async def lookup(self, key: str) -> Any:
        from tenure.model import LookupFailed

        return LookupFailed("blind")

    async def poll(self, provider_job_id: str) -> Any:
        from tenure.model import LookupFailed

        return LookupFailed("blind")

    async def cancel(self, provider_job_id: str) -> bool:
        return False


async def _egress() -> Any:
    from tenure.model import EgressDecision

    return EgressDecision(decision_id="egress-direct", allowed=True, policy_revision="p")


async def test_a_recovery_relay_racing_a_live_sender_never_causes_a_second_effect(db_url: str) -> None:
    # The sender's transmission is held open until the relay has looked (an event, not a
    # delay), under a submit lease no loaded machine outlives meanwhile.
    fake = FakeProvider("lookup_only")
    fake.submit_gate = asyncio.Event()
    async with AttemptLedger(db_url) as live, AttemptLedger(db_url) as relay:
        attempt_id = await live.prepare(spec(kind="lookup_only"))
        sender = asyncio.ensure_future(AttemptRunner(live, fake, poll_interval_s=0, submit_lease_seconds=600).run(attempt_id))
        await asyncio.wait_for(fake.submitting.wait(), 60)  # the sender is inside submit now (a hang guard)
        report = await runner(relay, fake).reconcile_unresolved(deadline_s=2)
        second = await runner(relay, fake).run(attempt_id)  # another process restarting the same work
        assert report.moved == 0 and second.state is AttemptState.SUBMITTING
        fake.submit_gate.set()
        final = await sender
    assert final.state is AttemptState.SUCCEEDED and fake.effects[final.idempotency_key] == 1


async def test_a_requested_cancel_is_carried_to_the_provider_and_recorded_on_its_confirmation(db_url: str) -> None:
    fake = FakeProvider("lookup_only")
    async with AttemptLedger(db_url) as ledger:
        attempt_id = await ledger.prepare(spec(kind="lookup_only"))
        granted = await ledger.begin_submit(attempt_id, egress=await _egress())
        assert granted is not None
        await ledger.record_accepted(attempt_id, provider_job_id=await fake.submit(granted))
        await ledger.request_cancel(attempt_id)
        report = await runner(ledger, fake).reconcile_unresolved()
        record = await ledger.get(attempt_id)
    assert (report.moved, record.state) == (1, AttemptState.CANCELLED)  # type: ignore[union-attr]


# --- crash points --------------------------------------------------------------------------------


class DyingLedger:
    """The ledger, except that the process dies just before or just after one call."""

    def __init__(self, ledger: AttemptLedger, method: str, when: str) -> None:
        self._ledger, self._method, self._when = ledger, method, when

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._ledger, name)
        if name != self._method:
            return target

        async def dying(*args: Any, **kwargs: Any) -> Any:
            if self._when == "before":
                raise ProcessDied()
            await target(*args, **kwargs)  # the call completes; then the process dies
            raise ProcessDied()

        return dying


LEDGER_POINTS = [(method, when) for method in ("begin_submit", "record_accepted", "record_ambiguous", "record_failed")
                 for when in ("before", "after")]
DRIVER_POINTS = ["die_before_effect", "die_after_effect", "poll"]
"""Dying while asking the provider to cancel has its own test below."""
CRASH_CASES = [(kind, point) for kind in ("replay", "lookup_only", "neither")
               for point in [f"{m}:{w}" for m, w in LEDGER_POINTS] + DRIVER_POINTS]


def _plan_for(point: str) -> list[str]:
    if point.startswith("record_ambiguous"):
        return ["timeout_after_effect"]
    if point.startswith("record_failed"):
        return ["reject"]
    if point in ("die_before_effect", "die_after_effect"):
        return [point]
    return ["ok"]


@pytest.mark.parametrize(("kind", "point"), CRASH_CASES, ids=[f"{k}-{p}" for k, p in CRASH_CASES])
async def test_after_a_crash_at_any_await_point_recovery_reaches_an_allowed_state_with_at_most_one_effect(
    db_url: str, kind: str, point: str
) -> None:
    fake = FakeProvider(kind, plan=_plan_for(point))
    async with AttemptLedger(db_url) as doomed:
        attempt_id = await doomed.prepare(spec(kind=kind))
        ledger: Any = doomed
        if ":" in point:
            method, when = point.split(":")
            ledger = DyingLedger(doomed, method, when)
        if point == "poll":
            fake.die_at.add("poll")
        died = False
        try:
            await AttemptRunner(ledger, fake, poll_interval_s=0, submit_lease_seconds=LEASE_S).run(attempt_id)
        except ProcessDied:
            died = True
    fake.die_at.clear()
    # A new process: a fresh ledger reconciles, then restarts the same work.
    await asyncio.sleep(LEASE_S * 2)
    async with AttemptLedger(db_url) as fresh:
        recovery = runner(fresh, fake)
        await recovery.reconcile_unresolved(deadline_s=2)
        await recovery.run(attempt_id)
        await asyncio.sleep(LEASE_S * 2)
        await recovery.reconcile_unresolved(deadline_s=2)
        record = await fresh.get(attempt_id)
    assert record is not None
    key = record.idempotency_key
    assert fake.effects[key] <= 1, "an unproven effect was repeated"
    if point.startswith("record_failed"):
        # A definite rejection: FAILED once recorded; if the process died before
        # recording it, the rejection left no effect, which recovery proves or reports.
        assert record.state in (AttemptState.FAILED, AttemptState.SUCCEEDED, AttemptState.INDETERMINATE)
    else:
        assert record.state is not AttemptState.FAILED, "a failure was fabricated"
    if fake.effects[key] == 1 and kind != "neither":
        assert record.state in (AttemptState.SUCCEEDED, AttemptState.CANCELLED), "a found effect was not settled"
    if record.state is AttemptState.SUCCEEDED:
        assert record.provider_job_id in fake.jobs
    assert died, "the crash point was reached"


async def test_a_crash_while_asking_the_provider_to_cancel_is_finished_by_recovery(db_url: str) -> None:
    fake = FakeProvider("lookup_only")
    async with AttemptLedger(db_url) as doomed:
        attempt_id = await doomed.prepare(spec(kind="lookup_only"))
        granted = await doomed.begin_submit(attempt_id, egress=await _egress())
        assert granted is not None
        await doomed.record_accepted(attempt_id, provider_job_id=await fake.submit(granted))
        await doomed.request_cancel(attempt_id)
        fake.die_at.add("cancel")
        with pytest.raises(ProcessDied):
            await runner(doomed, fake).run(attempt_id)
    fake.die_at.clear()
    async with AttemptLedger(db_url) as fresh:
        await runner(fresh, fake).reconcile_unresolved()
        record = await fresh.get(attempt_id)
    assert record is not None and record.state is AttemptState.CANCELLED and fake.effects[record.idempotency_key] == 1
