"""Consent deadlines: a consent created with ``expires_in_s`` keeps ``expires_at`` on the
database clock; every relay round expires the pending consents whose deadline passed (as
``tenure:deadline``, the deadline owner) and resumes their Runs, whose next hop sees
``ctx.consent.status == expired``; a verdict that came first stands; the deadline owner's
expiry before the deadline, or of a consent without one, is refused; a failure while
applying deadlines never stops a relay. Every database test runs on SQLite and
PostgreSQL."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
from adapter_support import raw
from hypothesis import given
from hypothesis import strategies as st
from polling import until
from run_support import admit, ports, serving, status_of, worker

from tenure.adapters import InMemoryBroker, RunLedger, RunRuntime, RunWorker, Workflows
from tenure.adapters.runs.ledger import expire_due_consents
from tenure.apps.runs_cli import _show
from tenure.conformance.strategies.consents import DECIDERS, consent_records
from tenure.kernel.consents.commands import DecideConsent
from tenure.kernel.consents.finders import due_consents
from tenure.kernel.consents.machine import CONSENTS, DEADLINE_OWNER
from tenure.kernel.consents.record import ConsentRow
from tenure.kernel.core import Applied, decide
from tenure.model import ConfigValidationError, ConsentStatus, RunStatus, WaitKind

SHORT_S = 0.3
"""A deadline that passes within the test (the relays apply it on their next round)."""


@pytest.fixture
async def ledger(db_url: str) -> AsyncIterator[RunLedger]:
    async with RunLedger(db_url) as made:
        yield made


def asker(flows: Workflows, seen: list[Any], *, expires_in_s: float | None = SHORT_S) -> None:
    """A workflow that asks for consent (with a deadline) and returns the verdict it resumed with."""
    @flows.workflow("ask", "1")
    async def ask(ctx: Any) -> dict[str, Any]:
        if not ctx.resumed:
            await ctx.request_consent(tool_name="mail.send", tool_call_id="call-1", payload={"to": "bob"},
                                      state={"asked": True}, expires_in_s=expires_in_s)
        seen.append((ctx.consent.status, ctx.consent.decided_by, ctx.state))
        return {"verdict": ctx.consent.status.value, "by": ctx.consent.decided_by}


@contextlib.asynccontextmanager
async def runtime(ledger: RunLedger, broker: Any, flows: Workflows) -> AsyncIterator[RunRuntime]:
    runner = RunWorker(ledger, broker, flows, node="node-a", watch_interval_s=0.05)
    async with RunRuntime(ledger, brokers=[broker], workers=[runner], node="node-a", relay_interval_s=0.1,
                          node_lease_s=5, require_clean=False) as started:
        yield started


async def parked_consent(ledger: RunLedger, broker: Any, flows: Workflows) -> tuple[str, Any]:
    """Admit a Run of ``ask``, run its first hop with a worker, and return it parked with its consent."""
    run_id = await admit(ledger, flows.pin("ask", "1"))
    async with serving(worker(ledger, broker, flows)):
        await ledger.publish(run_id, 0, broker)
        parked = await status_of(ledger, run_id, RunStatus.AWAITING_CONSENT)
    consent = await ledger.consents.get(parked.owner_id)
    assert consent is not None and consent.status is ConsentStatus.PENDING
    return run_id, consent


async def past(ledger: RunLedger, instant: dt.datetime) -> None:
    """Wait until the database clock is past ``instant`` (a hang guard, not a timing)."""
    async def check() -> bool:
        return await ledger.database_now() > instant
    await until(check)


# --- the relays apply deadlines ----------------------------------------------------------------


async def test_a_relay_round_after_the_deadline_expires_the_consent_and_the_resumed_hop_sees_expired(
    ledger: RunLedger, db_url: str,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen)
    async with runtime(ledger, broker, flows):
        run_id = await admit(ledger, flows.pin("ask", "1"))
        await ledger.publish(run_id, 0, broker)
        done = await status_of(ledger, run_id, RunStatus.DONE, RunStatus.FAILED)
    assert (done.status, done.result) == (RunStatus.DONE, {"verdict": "expired", "by": DEADLINE_OWNER})
    assert done.enqueue_seq == 1
    assert seen == [(ConsentStatus.EXPIRED, DEADLINE_OWNER, {"asked": True})]  # the resumed hop ran once
    consents = raw(db_url, "SELECT consent_id FROM tenure_consents")
    consent = await ledger.consents.get(consents[0][0])
    assert consent is not None and consent.expires_at is not None and consent.decided_at is not None
    assert consent.expires_at - consent.created_at == dt.timedelta(seconds=SHORT_S)
    assert consent.decided_at >= consent.expires_at  # never before its deadline


async def test_a_parked_consent_is_expired_by_the_first_relay_round_after_its_deadline_and_published(
    ledger: RunLedger,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen)
    run_id, consent = await parked_consent(ledger, broker, flows)
    assert consent.expires_at - consent.created_at == dt.timedelta(seconds=SHORT_S)
    await past(ledger, consent.expires_at)
    await ledger.relay(ports(ledger, broker))
    expired = await ledger.consents.get(consent.consent_id)
    assert expired is not None and (expired.status, expired.decided_by) == (ConsentStatus.EXPIRED, DEADLINE_OWNER)
    run = await ledger.get(run_id)
    delivery = await ledger.get_delivery(run_id, 1)
    assert run is not None and (run.status, run.enqueue_seq) == (RunStatus.QUEUED, 1)
    assert delivery is not None and delivery.resume and delivery.publish_attempts == 1  # published, not left over
    assert await expire_due_consents(ledger) == 0  # once


async def test_a_consent_decided_before_its_deadline_is_not_expired(ledger: RunLedger) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen)
    run_id, consent = await parked_consent(ledger, broker, flows)
    assert await ledger.consents.decide(consent.consent_id, ConsentStatus.GRANTED, decided_by="bob")
    await past(ledger, consent.expires_at)
    assert await expire_due_consents(ledger) == 0
    await ledger.relay(ports(ledger, broker))
    decided = await ledger.consents.get(consent.consent_id)
    assert decided is not None and (decided.status, decided.decided_by) == (ConsentStatus.GRANTED, "bob")
    assert not await ledger.consents.decide(consent.consent_id, ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)


async def test_the_deadline_owners_expiry_before_the_deadline_is_refused_and_nothing_changes(
    ledger: RunLedger,
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen, expires_in_s=3600)
    run_id, consent = await parked_consent(ledger, broker, flows)
    assert consent.expires_at - consent.created_at == dt.timedelta(hours=1)
    assert not await ledger.consents.decide(consent.consent_id, ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)
    assert await expire_due_consents(ledger) == 0
    await ledger.relay(ports(ledger, broker))
    assert await ledger.consents.get(consent.consent_id) == consent
    assert (await ledger.get(run_id)).status is RunStatus.AWAITING_CONSENT  # type: ignore[union-attr]
    # Any other principal may still send ``expired`` at any time.
    assert await ledger.consents.decide(consent.consent_id, ConsentStatus.EXPIRED, decided_by="bob")


async def test_a_consent_without_a_deadline_is_never_expired_by_relays(ledger: RunLedger, db_url: str) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen, expires_in_s=None)
    run_id, consent = await parked_consent(ledger, broker, flows)
    assert consent.expires_at is None
    assert raw(db_url, "SELECT expires_at FROM tenure_consents WHERE consent_id = ?",
               (consent.consent_id,)) == [(None,)]
    for _ in range(3):
        await ledger.relay(ports(ledger, broker))
    assert await expire_due_consents(ledger) == 0
    assert not await ledger.consents.decide(consent.consent_id, ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)
    assert await ledger.consents.get(consent.consent_id) == consent
    assert (await ledger.get(run_id)).status is RunStatus.AWAITING_CONSENT  # type: ignore[union-attr]


async def test_a_failure_while_applying_deadlines_is_logged_and_the_relay_round_goes_on(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    async def broken(**_: Any) -> int:
        raise RuntimeError("secret-payload")

    monkeypatch.setattr(ledger.consents, "expire_due", broken)
    with caplog.at_level(logging.WARNING, logger="tenure.runs.ledger"):
        report = await ledger.relay(ports(ledger, InMemoryBroker()))
    assert not report.degraded and report.cursor is not None
    assert "consent deadlines failed with RuntimeError" in caplog.text
    assert "secret-payload" not in caplog.text


# --- bounds -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, 0.0, -1, 30 * 24 * 3600 + 0.001, math.nan, math.inf, True, "5", [1]])
async def test_a_deadline_out_of_range_raises_config_validation_error_and_writes_nothing(
    ledger: RunLedger, db_url: str, bad: Any,
) -> None:
    pin = Workflows().register("ask", "1", _noop)
    run_id = await admit(ledger, pin)
    with pytest.raises(ConfigValidationError) as caught:
        await ledger.consents.create(run_id, tool_name="mail.send", tool_call_id="call-1", payload={},
                                    expires_in_s=bad)
    assert caught.value.fields == ("expires_in_s",) and run_id not in str(caught.value)
    assert raw(db_url, "SELECT count(*) FROM tenure_consents")[0][0] == 0
    with pytest.raises(ConfigValidationError):
        await expire_due_consents(ledger, limit=0)


async def _noop(ctx: Any) -> None:
    return None


async def test_the_longest_deadline_is_thirty_days_and_the_shortest_a_microsecond(ledger: RunLedger) -> None:
    broker, pin = InMemoryBroker(), Workflows().register("ask", "1", _noop)
    made = []
    for seconds in (30 * 24 * 3600, 1e-9):
        run_id = await admit(ledger, pin)
        await ledger.publish(run_id, 0, broker)
        assert await ledger.claim(run_id, 0, node="node-a") is not None
        made.append(await ledger.consents.create(run_id, tool_name="t", tool_call_id="c", payload={},
                                                expires_in_s=seconds))
    assert made[0].expires_at - made[0].created_at == dt.timedelta(days=30)  # type: ignore[operator]
    assert made[1].expires_at - made[1].created_at == dt.timedelta(microseconds=1)  # type: ignore[operator]


# --- the operator's view ------------------------------------------------------------------------------


async def test_runs_show_prints_the_deadline_of_the_consent_a_run_waits_on(
    ledger: RunLedger, capsys: pytest.CaptureFixture[str],
) -> None:
    flows, broker, seen = Workflows(), InMemoryBroker(), []
    asker(flows, seen, expires_in_s=3600)
    run_id, consent = await parked_consent(ledger, broker, flows)
    assert await _show(ledger, argparse.Namespace(run_id=run_id, result=False, show_payload=False)) == 0
    shown = capsys.readouterr().out
    assert f"{WaitKind.CONSENT.value} {consent.consent_id}" in shown
    assert f"pending, deadline {consent.expires_at:%Y-%m-%d %H:%M:%S}" in shown


# --- the finder against the kernel ----------------------------------------------------------------------


@given(record=consent_records().filter(lambda row: row is not None),
       now=st.integers(-3, 3) | st.integers(-10**12, 10**12), anchored=st.booleans())
def test_due_consents_selects_exactly_the_consents_the_deadline_owners_expiry_applies_to(
    record: ConsentRow, now: int, anchored: bool,
) -> None:
    at = now + (record.expires_at_us if anchored and record.expires_at_us is not None else record.created_at_us)
    expire = DecideConsent(verdict=ConsentStatus.EXPIRED, decided_by=DEADLINE_OWNER)
    applies = isinstance(decide(CONSENTS, record, expire, at), Applied)
    assert due_consents.matches(record, {"now": at}) == applies
    assert DEADLINE_OWNER in DECIDERS  # the kernel's generated situations send it too
