"""The machine under test for the consent (``specs/consent.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import MachineUnderTest
from tenure.conformance.strategies.consents import consent_situations
from tenure.kernel import CONSENTS
from tenure.kernel.consents.record import ConsentStep

# --- the consent machine's guards, from specs/consent.md's glossary --------------------------

CONSENT_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_not_running": lambda r, c, n: c.run_running is False,
    "preauthorized": lambda r, c, n: c.row.preauthorized_by is not None,
    "verdict_granted": lambda r, c, n: c.verdict.value == "granted",
    "verdict_denied": lambda r, c, n: c.verdict.value == "denied",
    "verdict_expired": lambda r, c, n: c.verdict.value == "expired",
    "deadline_not_due": lambda r, c, n: c.decided_by == "tenure:deadline" and not (
        c.verdict.value == "expired" and r.expires_at_us is not None and r.expires_at_us <= n),
}


def _consent_state(record: Any) -> enum.Enum:
    return ConsentStep.ABSENT if record is None else ConsentStep(record.status.value)


UNDER_TEST = MachineUnderTest(
    name="consent",
    machine=CONSENTS,
    situations=lambda state=None, kind=None: consent_situations(state, kind),
    terminal=frozenset({ConsentStep.GRANTED, ConsentStep.DENIED, ConsentStep.EXPIRED, ConsentStep.CANCELLED}),
    live=frozenset({ConsentStep.PENDING}),
    terminal_exit_allowed=lambda state, command, rule: False,
    state_of_record=_consent_state,
    oracle_guards=CONSENT_ORACLE_GUARDS,
)
