"""A consent's verdicts through the Run ledger, on every database: the first verdict
wins (also among concurrent ones), a preauthorized consent is created granted, and
expiry is a verdict that nothing derives from a clock (deadlines:
test_consent_deadlines.py). Moved from tests/adapters/runs/test_run_ledger.py, whose
module database and Runs driver (run_support.py) these tests share in form.
"""

from __future__ import annotations

import pytest

from adapter_support import raw, stored_instant
from run_support import Runs, ledger, on_ledgers, runs, runs_db, unique  # noqa: F401 (ledger, runs, runs_db: fixtures)
from tenure.adapters import RunLedger
from tenure.kernel.consents.machine import PREAUTHORIZED_BY
from tenure.model import ConfigValidationError, ConsentStatus


@pytest.mark.parametrize("first", [ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED])
async def test_the_first_verdict_wins(runs: Runs, first: ConsentStatus) -> None:
    run_id = await runs.running("run-1")
    consent_id = await runs.consent(run_id)
    made = await runs.ledger.consents.get(consent_id)
    assert made is not None and (made.status, made.verdict, made.decided_by, made.decided_at) == (
        ConsentStatus.PENDING, None, None, None)
    assert (made.run_id, made.tool_name, made.payload) == (run_id, "mail.send", {"to": "bob"})
    assert await runs.ledger.consents.decide(consent_id, first, decided_by="bob") is True
    for later in (ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED):
        assert await runs.ledger.consents.decide(consent_id, later, decided_by="carol") is False
    consent = await runs.ledger.consents.get(consent_id)
    assert consent is not None and (consent.status, consent.decided_by) == (first, "bob")
    assert consent.decided_at is not None and consent.decided_at >= consent.created_at
    assert consent.verdict is (first is ConsentStatus.GRANTED)


async def test_concurrent_verdicts_on_one_consent_have_one_winner(runs: Runs, runs_db: str) -> None:
    consent_id = await runs.consent(await runs.running("run-1"))
    verdicts = [ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED] * 2

    async def call(ledger: RunLedger, number: int) -> bool:
        return await ledger.consents.decide(consent_id, verdicts[number], decided_by=f"principal-{number}")

    outcomes = await on_ledgers(runs_db, len(verdicts), call)
    assert outcomes.count(True) == 1
    consent = await runs.ledger.consents.get(consent_id)
    winner = outcomes.index(True)
    assert consent is not None and (consent.status, consent.decided_by) == (verdicts[winner], f"principal-{winner}")


async def test_a_preauthorized_consent_is_created_granted(runs: Runs) -> None:
    consent_id = await runs.consent(await runs.running("run-1"), preauthorized=True)
    consent = await runs.ledger.consents.get(consent_id)
    assert consent is not None
    assert (consent.status, consent.decided_by, consent.preauthorized_by) == (
        ConsentStatus.GRANTED, PREAUTHORIZED_BY, "policy-7")
    assert consent.decided_at == consent.created_at
    assert await runs.ledger.consents.decide(consent_id, ConsentStatus.DENIED, decided_by="bob") is False


async def test_expiry_is_a_verdict_and_never_derived_from_a_clock(runs: Runs, runs_db: str) -> None:
    run_id, consent_id = await runs.waiting_on_consent("run-1")
    # A consent a year old is still pending: nothing reads a clock to expire it.
    raw(runs_db, "UPDATE tenure_consents SET created_at = ? WHERE consent_id = ?",
        (stored_instant(runs_db, 1_700_000_000_000_000), consent_id))
    assert (await runs.ledger.consents.get(consent_id)).status is ConsentStatus.PENDING  # type: ignore[union-attr]
    assert await runs.ledger.resume(run_id, owner_id=consent_id) is None
    assert await runs.ledger.consents.decide(consent_id, ConsentStatus.EXPIRED, decided_by="deadline-keeper")
    assert (await runs.ledger.consents.get(consent_id)).status is ConsentStatus.EXPIRED  # type: ignore[union-attr]
    for verdict in (ConsentStatus.PENDING, ConsentStatus.CANCELLED, "granted"):
        with pytest.raises(ConfigValidationError) as caught:
            await runs.ledger.consents.decide(consent_id, verdict, decided_by="bob")  # type: ignore[arg-type]
        assert caught.value.fields == ("verdict",)
    assert await runs.ledger.consents.decide(unique("consent")[:36], ConsentStatus.GRANTED, decided_by="bob") is False
