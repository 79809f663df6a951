"""A second interpretation of specs/queue.md, built with `transitions`, must agree with the kernel.

The oracle knows nothing of the kernel's code: it reads the spec rows, turns each into
a `transitions` transition (first matching transition wins, as the spec says), and
evaluates guards written here again from the spec's guard glossary. For generated
records and commands it must pick the same row as the kernel.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from transitions import Machine

from queue_strategies import situations
from spec_tables import parse_rows, read_spec
from tenure.kernel import select_rule
from tenure.model import JobStatus, QueueKind

INT64_MAX = 2**63 - 1


def _lease_live(record: Any, now: int) -> bool:
    return record.lease_expires_at_us is not None and now < record.lease_expires_at_us


def _fence_mismatch(record: Any, fence: Any, now: int) -> bool:
    same_strings = all(
        isinstance(mine, str) and mine == theirs
        for mine, theirs in (
            (fence.job_id, record.job_id),
            (fence.owner_id, record.owner_id),
            (fence.claim_token, record.claim_token),
        )
    )
    same_generation = type(fence.generation) is int and fence.generation == record.generation
    return not (same_strings and same_generation and fence.queue == record.queue)


def _dedupe_key(record: Any) -> Any:
    return record.active_key if record.queue == QueueKind.STREAMING else record.idempotency_key


def _requested_key(record: Any, command: Any) -> Any:
    return command.active_key if record.queue == QueueKind.STREAMING else command.idempotency_key


ORACLE_GUARDS = {
    "always": lambda r, c, n: True,
    "protection_inconsistent": lambda r, c, n: not (
        (r.submission_id is None) == (r.fingerprint is None) == (not r.fence_required)
    ),
    "legacy_row": lambda r, c, n: r.fence_required is False,
    "other_submission": lambda r, c, n: r.submission_id != c.submission_id,
    "fingerprint_differs": lambda r, c, n: r.fingerprint != c.fingerprint,
    "protected": lambda r, c, n: r.fence_required is True,
    "protected_or_owned": lambda r, c, n: r.fence_required is True
    or (r.status == JobStatus.CLAIMED and r.claim_token is not None),
    "key_differs": lambda r, c, n: _requested_key(r, c) is None or _dedupe_key(r) != _requested_key(r, c),
    "not_forced": lambda r, c, n: c.force is False,
    "nonce_stored": lambda r, c, n: c.nonce_already_stored is True,
    "not_due": lambda r, c, n: n < r.fires_at_us,
    "attempts_exhausted": lambda r, c, n: not r.attempts < r.max_attempts,
    "generation_exhausted": lambda r, c, n: r.generation == INT64_MAX or r.generation > INT64_MAX,
    "owner_differs": lambda r, c, n: not (r.owner_id is not None and r.owner_id == c.owner_id),
    "token_differs": lambda r, c, n: not (r.claim_token is not None and r.claim_token == c.claim_token),
    "lease_live": lambda r, c, n: _lease_live(r, n),
    "lease_not_live": lambda r, c, n: not _lease_live(r, n),
    "fence_mismatch": lambda r, c, n: _fence_mismatch(r, c.fence, n),
    "cancel_requested": lambda r, c, n: r.cancel_requested is True,
    "no_cancel_request": lambda r, c, n: r.cancel_requested is False,
    "retry_allowed": lambda r, c, n: c.retry is True and r.attempts < r.max_attempts,
    "streaming": lambda r, c, n: r.queue == QueueKind.STREAMING,
    "not_streaming": lambda r, c, n: r.queue != QueueKind.STREAMING,
    "finished_after_cutoff": lambda r, c, n: r.completed_at_us is None or not r.completed_at_us < c.older_than_us,
}

SPEC_ROWS = parse_rows(read_spec("queue"))


class Oracle:
    """The spec rows as a `transitions` machine; ``fired`` records the row that ran."""

    def __init__(self) -> None:
        self.fired: tuple[str, str, bool] | None = None
        states = sorted({row.source for row in SPEC_ROWS} | {row.target for row in SPEC_ROWS})
        self.machine = Machine(
            model=self,
            states=states,
            initial="absent",
            auto_transitions=False,
            send_event=True,
            ignore_invalid_triggers=False,
        )
        for row in SPEC_ROWS:
            self.machine.add_transition(
                trigger=row.command,
                source=row.source,
                dest=None if row.refusal else row.target,
                conditions=[self._guard(row.guard)],
                after=[self._record(row.target, row.outcome, row.refusal)],
            )

    @staticmethod
    def _guard(name: str) -> Any:
        guard = ORACLE_GUARDS[name]
        return lambda event: guard(event.kwargs["record"], event.kwargs["command"], event.kwargs["now"])

    def _record(self, target: str, outcome: str, refusal: bool) -> Any:
        def note(event: Any) -> None:
            self.fired = (target, outcome, refusal)

        return note

    def run(self, record: Any, command: Any, now: int) -> tuple[str, str, bool]:
        self.fired = None
        self.machine.set_state("absent" if record is None else record.status.value)
        self.trigger(command.kind.value, record=record, command=command, now=now)  # type: ignore[attr-defined]
        assert self.fired is not None, "no spec row fired: the table is not total"
        return self.fired


ORACLE = Oracle()


@settings(max_examples=3000)
@given(situation=situations())
def test_the_transitions_oracle_picks_the_same_row_as_the_kernel(situation: tuple[Any, Any, int]) -> None:
    record, command, now_us = situation
    rule = select_rule(record, command, now_us)
    kernel_choice = (
        rule.target.value,
        rule.outcome if isinstance(rule.outcome, str) else rule.outcome.value,
        not isinstance(rule.outcome, str),
    )
    assert ORACLE.run(record, command, now_us) == kernel_choice
