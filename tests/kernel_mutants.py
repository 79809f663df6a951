"""Deliberately broken queue kernels. The suite must fail for every one (test_mutants.py).

Each mutant patches the kernel's tables in place, the way a plausible bug would look:
one comparison dropped, one rule missing, one effect off by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tenure.kernel.queue import machine
from tenure.kernel.queue.commands import CommandType as C
from tenure.kernel.queue.record import QueueState as S


def _fence_mismatch_without(part: str) -> Callable[[Any, Any, int], bool]:
    def guard(record: Any, command: Any, now_us: int) -> bool:
        fence = command.fence
        checks = {
            "queue": fence.queue is record.queue,
            "job_id": fence.job_id == record.job_id,
            "owner_id": fence.owner_id == record.owner_id,
            "generation": fence.generation == record.generation,
            "claim_token": record.claim_token is not None and fence.claim_token == record.claim_token,
        }
        if part == "older_generation":
            checks["generation"] = fence.generation <= record.generation
        else:
            checks.pop(part)
        return not all(checks.values())

    return guard


def _drop_rule(state: S, command: C, guard: str) -> None:
    machine.TABLE[(state, command)] = tuple(
        rule for rule in machine.TABLE[(state, command)] if rule.guard != guard
    )


def _replace_outcome(state: S, command: C, guard: str, target: S, outcome: str) -> None:
    machine.TABLE[(state, command)] = tuple(
        machine.Rule(guard, target, outcome) if rule.guard == guard else rule
        for rule in machine.TABLE[(state, command)]
    )


def skip_owner_check() -> None:
    machine.GUARDS["fence_mismatch"] = _fence_mismatch_without("owner_id")


def accept_older_generation() -> None:
    machine.GUARDS["fence_mismatch"] = _fence_mismatch_without("older_generation")


def accept_lease_ending_now() -> None:
    machine.GUARDS["lease_not_live"] = lambda record, command, now_us: (
        record.lease_expires_at_us is None or record.lease_expires_at_us < now_us
    )


def complete_cancel_requested_stream() -> None:
    _drop_rule(S.CLAIMED, C.COMPLETE_OWNED, "cancel_requested")


def promote_legacy_row() -> None:
    def promote(record: Any, command: Any, now_us: int) -> Any:
        promoted = dataclasses.replace(
            record, fence_required=True, submission_id=command.submission_id, fingerprint=command.fingerprint
        )
        return machine.Applied(promoted, machine.Submitted(record.job_id, record.run_id, replayed=True))

    machine.EFFECTS["promote"] = promote
    for state in (S.PENDING, S.CLAIMED, S.COMPLETED, S.FAILED, S.CANCELLED):
        _replace_outcome(state, C.SUBMIT_OWNED, "legacy_row", state, "promote")


def reuse_generation() -> None:
    original = machine.EFFECTS["claim_owned"]

    def claim(record: Any, command: Any, now_us: int) -> Any:
        decision = original(record, command, now_us)
        return machine.Applied(
            dataclasses.replace(decision.new_record, generation=record.generation), decision.reply
        )

    machine.EFFECTS["claim_owned"] = claim


def ignore_stored_nonce() -> None:
    machine.GUARDS["nonce_stored"] = lambda record, command, now_us: False


def replay_changed_content() -> None:
    machine.GUARDS["fingerprint_differs"] = lambda record, command, now_us: False


def legacy_write_on_owned_claim() -> None:
    for command in (C.HEARTBEAT_LEGACY, C.COMPLETE_LEGACY, C.FAIL_LEGACY, C.SET_PID_LEGACY):
        _drop_rule(S.CLAIMED, command, "protected_or_owned")


def requeue_expired_cancel_request() -> None:
    _drop_rule(S.CLAIMED, C.EXPIRE_LEASE, "cancel_requested")


def claim_before_due() -> None:
    machine.GUARDS["not_due"] = lambda record, command, now_us: False


MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (
        skip_owner_check,
        accept_older_generation,
        accept_lease_ending_now,
        complete_cancel_requested_stream,
        promote_legacy_row,
        reuse_generation,
        ignore_stored_nonce,
        replay_changed_content,
        legacy_write_on_owned_claim,
        requeue_expired_cancel_request,
        claim_before_due,
    )
}


def apply(name: str) -> None:
    MUTANTS[name]()
