"""The machine under test for the service attempt (``specs/attempts.md``): its guard glossary written
again, independently of the kernel, and what the shared table, oracle, property and
mutant tests need of it (``tests/support/machines.py`` reads ``UNDER_TEST``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from machines import MachineUnderTest
from tenure.conformance.strategies.attempts import attempt_situations
from tenure.kernel import ATTEMPTS
from tenure.kernel.attempts.record import AttemptStep

# --- the attempts' guards, from specs/attempts.md's glossary ----------------------------------

_ORDER = {"submitting": 1, "indeterminate": 1, "accepted": 2, "running": 3,
          "succeeded": 4, "failed": 4, "cancelled": 4, "prepared": 0}


def _lease_on(record: Any, now: int) -> bool:
    return record.submit_lease_expires_at_us is not None and now < record.submit_lease_expires_at_us


def _is(value: Any, name: str) -> bool:
    return getattr(value, "value", None) == name


def _found(name: str) -> Callable[[Any, Any, int], bool]:
    return lambda r, c, n: _is(c.lookup, "found") and _is(c.found_state, name)


ATTEMPT_ORACLE_GUARDS: dict[str, Callable[[Any, Any, int], bool]] = {
    "always": lambda r, c, n: True,
    "run_closed": lambda r, c, n: c.run_closed is True,
    "spec_differs": lambda r, c, n: r.spec_digest != c.row.spec_digest,
    "key_held_elsewhere": lambda r, c, n: c.key_held_elsewhere is True,
    "generation_gap": lambda r, c, n: c.row.generation - c.predecessor_generation != 1,
    "predecessor_succeeded": lambda r, c, n: _is(c.predecessor_state, "succeeded"),
    "predecessor_unresolved": lambda r, c, n: c.predecessor_state is not None
    and not (_is(c.predecessor_state, "failed") or _is(c.predecessor_state, "cancelled")),
    "egress_reused": lambda r, c, n: c.egress_decision_id in (*r.transmission_egress, *r.denied_egress),
    "egress_denied": lambda r, c, n: c.egress_allowed is False,
    "cancel_requested": lambda r, c, n: r.cancel_requested is True,
    "resubmit_unproven": lambda r, c, n: not (
        r.same_key_replay is True
        or (r.no_effect_proof_for is not None and r.no_effect_proof_for == r.transmissions)
        or (c.proof_looked_up_at_us is not None and not _lease_on(r, min(c.proof_looked_up_at_us, n)))
    ),
    "identity_differs": lambda r, c, n: None not in (r.provider_job_id, c.provider_job_id)
    and r.provider_job_id != c.provider_job_id,
    "identity_unknown": lambda r, c, n: r.provider_job_id is None,
    "rejection_not_of_the_latest": lambda r, c, n: _is(c.evidence, "rejected_before_effect")
    and (c.transmission is None or c.transmission < r.transmissions or c.transmission > r.transmissions),
    "rejection_beside_an_earlier_transmission": lambda r, c, n: _is(c.evidence, "rejected_before_effect")
    and r.granted_during_earlier_lease is True,
    "rejected_before_effect": lambda r, c, n: _is(c.evidence, "rejected_before_effect"),
    "provider_failed": lambda r, c, n: _is(c.evidence, "provider_failed"),
    "lookup_failed": lambda r, c, n: _is(c.lookup, "lookup_failed"),
    "not_found": lambda r, c, n: _is(c.lookup, "not_found"),
    "not_found_during_submit_lease": lambda r, c, n: _is(c.lookup, "not_found")
    and _lease_on(r, n if c.looked_up_at_us is None else min(c.looked_up_at_us, n)),
    "not_found_unproven": lambda r, c, n: _is(c.lookup, "not_found")
    and (c.proves_no_effect is not True or c.looked_up_at_us is None),
    "proof_recorded": lambda r, c, n: _is(c.lookup, "not_found") and r.no_effect_proof_for == r.transmissions,
    "found_not_ahead": lambda r, c, n: _is(c.lookup, "found") and c.found_state is not None
    and _ORDER[c.found_state.value] <= _ORDER[r.state.value],
    "found_accepted": _found("accepted"),
    "found_running": _found("running"),
    "found_succeeded": _found("succeeded"),
    "found_failed": _found("failed"),
    "found_cancelled": _found("cancelled"),
    "submit_lease_live": lambda r, c, n: _lease_on(r, n),
    "no_reservation": lambda r, c, n: r.reservation is None,
    "already_released": lambda r, c, n: r.reservation_released is True,
}


def _attempt_state(record: Any) -> enum.Enum:
    return AttemptStep.ABSENT if record is None else AttemptStep(record.state.value)


UNDER_TEST = MachineUnderTest(
    name="attempts",
    machine=ATTEMPTS,
    situations=lambda state=None, kind=None: attempt_situations(state, kind),
    terminal=frozenset({AttemptStep.SUCCEEDED, AttemptStep.FAILED, AttemptStep.CANCELLED}),
    live=frozenset({AttemptStep.PREPARED, AttemptStep.SUBMITTING, AttemptStep.ACCEPTED, AttemptStep.RUNNING,
                    AttemptStep.INDETERMINATE}),
    terminal_exit_allowed=lambda state, command, rule: False,
    state_of_record=_attempt_state,
    oracle_guards=ATTEMPT_ORACLE_GUARDS,
)
