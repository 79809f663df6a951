"""Typed entry points to the consent kernel's ``decide``, one per command, carrying its
contract (checked by CrossHair: ``.ci/crosshair_kernel.py check --analysis_kind=PEP316
--per_condition_timeout=...``; see :mod:`tenure.kernel.queue.contracts` for why one per
command).

The shared postcondition is the list of transition rules (TR-C1 ... TR-C4 in
``specs/consent.md``); each command adds the guarantee it is for: a consent is created
only for a RUNNING Run (granted only by a preauthorization), a verdict applies only to a
pending consent and only as one of the three verdicts (the deadline owner's only once
the consent's deadline has come), a sweep cancels only a pending consent.
"""

from __future__ import annotations

# Names used only inside the pre/post lines below: CrossHair evaluates those lines in
# this module's namespace (tests/kernel/test_contracts.py fails if one goes missing).
from tenure.model import ConsentStatus  # noqa: F401
from tenure.model.bounds import MIN_INSTANT_US  # noqa: F401

from ..core import Decision, Refused  # noqa: F401
from ..queue.commands import MAX_NOW_US  # noqa: F401
from .commands import CancelPending, CreateConsent, DecideConsent  # noqa: F401
from .machine import DEADLINE_OWNER, CONSENTS, transition_violations  # noqa: F401
from .record import MAX_DEADLINE_US, ConsentRow  # noqa: F401

__all__ = ["decide_create_consent", "decide_decide_consent", "decide_cancel_pending"]


def decide_create_consent(record: ConsentRow | None, command: CreateConsent, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    pre: command.expires_in_us is None or 1 <= command.expires_in_us <= MAX_DEADLINE_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record is None and command.run_running and (__return__.new_record.status is ConsentStatus.PENDING or command.row.preauthorized_by is not None))
    """
    return CONSENTS.decide(record, command, now_us)


def decide_decide_consent(record: ConsentRow | None, command: DecideConsent, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status is ConsentStatus.PENDING and __return__.new_record.status is command.verdict and command.verdict in (ConsentStatus.GRANTED, ConsentStatus.DENIED, ConsentStatus.EXPIRED))
    post: isinstance(__return__, Refused) or command.decided_by != DEADLINE_OWNER or (record.expires_at_us is not None and now_us >= record.expires_at_us)
    """
    return CONSENTS.decide(record, command, now_us)


def decide_cancel_pending(record: ConsentRow | None, command: CancelPending, now_us: int) -> Decision:
    """pre: MIN_INSTANT_US <= now_us <= MAX_NOW_US
    post: not transition_violations(record, command, now_us, __return__)
    post: isinstance(__return__, Refused) or (record.status is ConsentStatus.PENDING and __return__.new_record.decided_by == command.decided_by)
    """
    return CONSENTS.decide(record, command, now_us)
