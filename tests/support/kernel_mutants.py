"""Deliberately broken kernels, per machine. The suite must fail for every one (test_mutants.py).

Each mutant patches a machine's own table, guards or effects in place (``QUEUE.table``,
``QUEUE.guards``, ``QUEUE.effects``: the dictionaries the machine module declared), the
way a plausible bug would look: one comparison dropped, one rule missing, one effect off
by one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from tenure.kernel import AGENT_JOBS, ATTEMPTS, CONSENTS, NODES, QUEUE, RUNS, Applied, Rule
from tenure.kernel.queue.commands import Ack, Submitted
from tenure.kernel.queue.commands import QueueCommandType as C
from tenure.kernel.queue.record import QueueStep as S


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
    QUEUE.table[(state, command)] = tuple(
        rule for rule in QUEUE.table[(state, command)] if rule.guard != guard
    )


def _replace_outcome(state: S, command: C, guard: str, target: S, outcome: str) -> None:
    QUEUE.table[(state, command)] = tuple(
        Rule(guard, target, outcome) if rule.guard == guard else rule
        for rule in QUEUE.table[(state, command)]
    )


def skip_owner_check() -> None:
    QUEUE.guards["fence_mismatch"] = _fence_mismatch_without("owner_id")


def accept_older_generation() -> None:
    QUEUE.guards["fence_mismatch"] = _fence_mismatch_without("older_generation")


def accept_lease_ending_now() -> None:
    QUEUE.guards["lease_not_live"] = lambda record, command, now_us: (
        record.lease_expires_at_us is None or record.lease_expires_at_us < now_us
    )


def complete_cancel_requested_stream() -> None:
    _drop_rule(S.CLAIMED, C.COMPLETE_OWNED, "cancel_requested")


def promote_legacy_row() -> None:
    def promote(record: Any, command: Any, now_us: int) -> Any:
        promoted = dataclasses.replace(
            record, fence_required=True, submission_id=command.submission_id, fingerprint=command.fingerprint
        )
        return Applied(promoted, Submitted(record.job_id, record.run_id, replayed=True))

    QUEUE.effects["promote"] = promote
    for state in (S.PENDING, S.CLAIMED, S.COMPLETED, S.FAILED, S.CANCELLED):
        _replace_outcome(state, C.SUBMIT_OWNED, "legacy_row", state, "promote")


def reuse_generation() -> None:
    original = QUEUE.effects["claim_owned"]

    def claim(record: Any, command: Any, now_us: int) -> Any:
        decision = original(record, command, now_us)
        return Applied(
            dataclasses.replace(decision.new_record, generation=record.generation), decision.reply
        )

    QUEUE.effects["claim_owned"] = claim


def ignore_stored_nonce() -> None:
    QUEUE.guards["nonce_stored"] = lambda record, command, now_us: False


def replay_changed_content() -> None:
    QUEUE.guards["fingerprint_differs"] = lambda record, command, now_us: False


def legacy_write_on_owned_claim() -> None:
    for command in (C.HEARTBEAT_LEGACY, C.COMPLETE_LEGACY, C.FAIL_LEGACY, C.SET_PID_LEGACY):
        _drop_rule(S.CLAIMED, command, "protected_or_owned")


def requeue_expired_cancel_request() -> None:
    _drop_rule(S.CLAIMED, C.EXPIRE_LEASE, "cancel_requested")


def claim_before_due() -> None:
    QUEUE.guards["not_due"] = lambda record, command, now_us: False


def release_spends_the_attempt() -> None:
    original = QUEUE.effects["release"]

    def release(record: Any, command: Any, now_us: int) -> Any:
        decision = original(record, command, now_us)
        return Applied(dataclasses.replace(decision.new_record, attempts=record.attempts), decision.reply)

    QUEUE.effects["release"] = release


def release_ignores_its_delay() -> None:
    # A job given back for another worker is due again at once: the worker that gave it
    # back takes it again in its next claim.
    _drop_rule(S.CLAIMED, C.RELEASE_OWNED, "delayed")


def release_without_fence() -> None:
    _drop_rule(S.CLAIMED, C.RELEASE_OWNED, "fence_mismatch")


def release_after_the_lease() -> None:
    _drop_rule(S.CLAIMED, C.RELEASE_OWNED, "lease_not_live")


def release_cancel_requested_stream() -> None:
    _drop_rule(S.CLAIMED, C.RELEASE_OWNED, "cancel_requested")


def release_running_launch() -> None:
    _drop_rule(S.CLAIMED, C.RELEASE_OWNED, "pid_recorded")


def retry_completed_job() -> None:
    _replace_outcome(S.COMPLETED, C.RETRY_FAILED, "always", S.PENDING, "retry_failed")


def retry_keeps_spent_attempts() -> None:
    original = QUEUE.effects["retry_failed"]

    def retry(record: Any, command: Any, now_us: int) -> Any:
        decision = original(record, command, now_us)
        return Applied(dataclasses.replace(decision.new_record, attempts=record.attempts), decision.reply)

    QUEUE.effects["retry_failed"] = retry


def retry_failed_stream() -> None:
    _drop_rule(S.FAILED, C.RETRY_FAILED, "streaming")


def claim_any_task_queue() -> None:
    _drop_rule(S.PENDING, C.CLAIM_OWNED, "other_queue")
    _drop_rule(S.PENDING, C.CLAIM_LEGACY, "other_queue")


def progress_without_fence() -> None:
    _drop_rule(S.CLAIMED, C.PROGRESS_OWNED, "fence_mismatch")


def progress_on_any_queue() -> None:
    _drop_rule(S.CLAIMED, C.PROGRESS_OWNED, "not_task")


def jitter_beyond_half() -> None:
    # The jitter is a function the effects call, not a row of the table: patched where
    # they look it up.
    from tenure.kernel.queue import machine

    original = machine.jittered_us
    machine.jittered_us = lambda delay_us, per_mille: original(delay_us, per_mille) - delay_us * per_mille // 1000


def tasks_by_lowest_priority() -> None:
    from tenure.kernel.queue import finders

    finders.eligible_tasks = dataclasses.replace(finders.eligible_tasks, order=("priority", "fires_at_us", "job_id"))


QUEUE_MUTANTS: dict[str, Callable[[], None]] = {
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
        release_spends_the_attempt,
        release_ignores_its_delay,
        release_without_fence,
        release_after_the_lease,
        release_cancel_requested_stream,
        release_running_launch,
        retry_completed_job,
        retry_keeps_spent_attempts,
        retry_failed_stream,
        claim_any_task_queue,
        progress_without_fence,
        progress_on_any_queue,
        jitter_beyond_half,
        tasks_by_lowest_priority,
    )
}


# --- the attempt machine -------------------------------------------------------------------

from tenure.kernel.attempts.commands import Ack as AttemptAck  # noqa: E402
from tenure.kernel.attempts.commands import AttemptCommandType as AC  # noqa: E402
from tenure.kernel.attempts.record import AttemptStep as AS  # noqa: E402
from tenure.kernel.attempts.record import replace_fields as replace_attempt  # noqa: E402
from tenure.model import AttemptState  # noqa: E402


def _attempt_rules(state: AS, command: AC, replace: Callable[[Any], Any]) -> None:
    ATTEMPTS.table[(state, command)] = tuple(replace(rule) for rule in ATTEMPTS.table[(state, command)])


def fabricate_failure_on_timeout() -> None:
    def fail(record: Any, command: Any, now_us: int) -> Any:
        return Applied(replace_attempt(record, state=AttemptState.FAILED, updated_at_us=now_us),
                                AttemptAck())

    ATTEMPTS.effects["fail_on_timeout"] = fail
    for state in (AS.SUBMITTING, AS.ACCEPTED, AS.RUNNING):
        _attempt_rules(state, AC.RECORD_AMBIGUOUS, lambda rule: dataclasses.replace(
            rule, target=AS.FAILED, outcome="fail_on_timeout"))


def resubmit_without_proof() -> None:
    ATTEMPTS.guards["resubmit_unproven"] = lambda record, command, now_us: False


def accept_second_identity() -> None:
    ATTEMPTS.guards["identity_differs"] = lambda record, command, now_us: False


def release_while_indeterminate() -> None:
    _attempt_rules(AS.INDETERMINATE, AC.RELEASE_RESERVATION, lambda rule: dataclasses.replace(rule, outcome="release"))


def new_generation_over_open_one() -> None:
    ATTEMPTS.guards["predecessor_unresolved"] = lambda record, command, now_us: False


def not_found_during_lease_proves_no_effect() -> None:
    ATTEMPTS.guards["not_found_during_submit_lease"] = lambda record, command, now_us: False


def rejection_of_any_transmission_fails() -> None:
    # A late rejection of an earlier transmission fails the attempt after a later one
    # was granted (and may land).
    ATTEMPTS.guards["rejection_not_of_the_latest"] = lambda record, command, now_us: False


def rejection_beside_an_earlier_one_fails() -> None:
    # A rejection of the latest transmission fails the attempt while an earlier one,
    # granted beside it on a same-key-replay binding, may still land.
    ATTEMPTS.guards["rejection_beside_an_earlier_transmission"] = lambda record, command, now_us: False


def not_found_judged_when_decided() -> None:
    # A not-found is judged against the submit lease at the instant its reconcile is
    # decided, not at its lookup's: a lookup made during the lease and reported after it
    # records a no-effect proof.
    def during_lease(record: Any, command: Any, now_us: int) -> bool:
        lease = record.submit_lease_expires_at_us
        return command.lookup.value == "not_found" and lease is not None and lease > now_us

    ATTEMPTS.guards["not_found_during_submit_lease"] = during_lease


def prepare_ignores_closed_run() -> None:
    # A new attempt lands for a Run that is settled or being cancelled: an effect behind
    # the Run's containment check.
    key = (AS.ABSENT, AC.PREPARE)
    ATTEMPTS.table[key] = tuple(rule for rule in ATTEMPTS.table[key] if rule.guard != "run_closed")


def cancelled_on_request() -> None:
    for state in (AS.SUBMITTING, AS.ACCEPTED, AS.RUNNING, AS.INDETERMINATE):
        _attempt_rules(state, AC.REQUEST_CANCEL, lambda rule: dataclasses.replace(
            rule, target=AS.CANCELLED, outcome="cancel_unsent") if rule.guard == "always" else rule)


ATTEMPT_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (
        fabricate_failure_on_timeout,
        resubmit_without_proof,
        accept_second_identity,
        release_while_indeterminate,
        rejection_of_any_transmission_fails,
        rejection_beside_an_earlier_one_fails,
        not_found_judged_when_decided,
        new_generation_over_open_one,
        not_found_during_lease_proves_no_effect,
        cancelled_on_request,
        prepare_ignores_closed_run,
    )
}

# --- the Run machine, the consent machine, the delegated-job machine -----------------------

from tenure.kernel.agent_jobs.commands import AgentJobCommandType as JC  # noqa: E402
from tenure.kernel.agent_jobs.record import AgentJobStep as JS  # noqa: E402
from tenure.kernel.consents.commands import ConsentCommandType as CC  # noqa: E402
from tenure.kernel.consents.machine import DEADLINE_OWNER  # noqa: E402
from tenure.kernel.consents.record import ConsentStep as CS  # noqa: E402
from tenure.kernel.runs.commands import Admitted  # noqa: E402
from tenure.kernel.runs.commands import RunCommandType as RC
from tenure.kernel.runs.record import RunPair, replace_delivery, replace_run  # noqa: E402
from tenure.kernel.runs.record import RunStep as RS
from tenure.model import ConsentStatus  # noqa: E402


def _run_rules(state: RS, command: RC, replace: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> None:
    RUNS.table[(state, command)] = replace(RUNS.table[(state, command)])


def resume_without_owner_check() -> None:
    # The resume trusts whoever names the current owner: the owner row's status, its
    # completeness and its Run are never looked at.
    RUNS.guards["owner_unresolved"] = lambda record, command, now_us: False


def claim_serves_any_workflow() -> None:
    # A worker claims a Run of a version it does not serve (and then fails it).
    _run_rules(RS.QUEUED, RC.CLAIM, lambda rules: tuple(rule for rule in rules if rule.guard != "not_served"))


def claim_ignores_sequence() -> None:
    _run_rules(RS.QUEUED, RC.CLAIM, lambda rules: tuple(rule for rule in rules if rule.guard != "seq_differs"))


def settle_over_cancelling() -> None:
    _run_rules(RS.CANCELLING, RC.SETTLE, lambda rules: (
        Rule("settles_done", RS.DONE, "settle_done"), Rule("always", RS.FAILED, "settle_failed")))


def cancelled_without_containment() -> None:
    _run_rules(RS.CANCELLING, RC.FINISH_CANCEL,
               lambda rules: tuple(rule for rule in rules if rule.guard != "containment_unproven"))


def replay_reroutes() -> None:
    def replay(record: Any, command: Any, now_us: int) -> Any:
        route = {"queue": command.run.queue, "priority": command.run.priority}
        rerouted = RunPair(replace_run(record.run, **route),
                           tuple(replace_delivery(delivery, **route) for delivery in record.deliveries))
        return Applied(rerouted, Admitted(created=False))

    RUNS.effects["replay"] = replay


def retry_without_retries_left() -> None:
    # A lost hop is retried whatever its workflow allows.
    for state in (RS.RUNNING, RS.AWAITING_HARDWARE):
        _run_rules(state, RC.RETRY_LOST, lambda rules: tuple(rule for rule in rules if rule.guard != "no_retries_left"))


def result_kept_with_failure() -> None:
    settle = RUNS.effects["settle_failed"]

    def keeps(record: Any, command: Any, now_us: int) -> Any:
        decided = settle(record, command, now_us)
        kept = replace_run(decided.new_record.run, result_json='{"kept":true}')
        return Applied(RunPair(kept, decided.new_record.deliveries), decided.reply)

    RUNS.effects["settle_failed"] = keeps


def timer_resumed_before_due() -> None:
    # A timer wait resumes as soon as its name is given, whatever the database clock says.
    _run_rules(RS.AWAITING_TIMER, RC.RESUME, lambda rules: tuple(rule for rule in rules if rule.guard != "timer_not_due"))


def timer_due_time_moved_by_resume() -> None:
    # The resume keeps the timer's due time: a queued Run carrying a wake time.
    resume = RUNS.effects["resume"]

    def keeps(record: Any, command: Any, now_us: int) -> Any:
        decided = resume(record, command, now_us)
        kept = replace_run(decided.new_record.run, wake_at_us=record.run.wake_at_us)
        return Applied(RunPair(kept, decided.new_record.deliveries), decided.reply)

    RUNS.effects["resume"] = keeps


def claim_replayed_to_any_claimant() -> None:
    # A claim of a running Run is answered whoever sends it: a duplicate delivery runs
    # the hop a second time beside the first.
    RUNS.guards["claimed_by_claimant"] = lambda record, command, now_us: (
        command.enqueue_seq == record.run.enqueue_seq and record.current.state.value == "claimed")


def claim_records_the_node_not_the_claimant() -> None:
    # The claim keeps the node, not the hop's token: its repeat is never recognised.
    claim = RUNS.effects["claim"]

    def by_node(record: Any, command: Any, now_us: int) -> Any:
        return claim(record, dataclasses.replace(command, claimant=None), now_us)

    RUNS.effects["claim"] = by_node


def time_out_before_the_deadline() -> None:
    # The deadline's owner is obeyed whenever it asks, whatever the database clock says.
    for state in (*_RUN_OPEN, RS.CANCELLING):
        _run_rules(state, RC.TIME_OUT, lambda rules: tuple(rule for rule in rules if rule.guard != "deadline_not_due"))


def time_out_without_a_deadline() -> None:
    # A Run admitted without a timeout counts as past its deadline.
    RUNS.guards["no_deadline"] = lambda record, command, now_us: False


def time_out_without_its_reason() -> None:
    # The Run is cancelled for its deadline but keeps no reason: an operator's cancel, as seen.
    time_out = RUNS.effects["time_out"]

    def reasonless(record: Any, command: Any, now_us: int) -> Any:
        decided = time_out(record, command, now_us)
        return Applied(RunPair(replace_run(decided.new_record.run, error=None), decided.new_record.deliveries),
                       decided.reply)

    RUNS.effects["time_out"] = reasonless


def replay_ignores_the_timeout() -> None:
    # A replay under the same key with another timeout answers the stored Run.
    for state in _RUN_ALL:
        _run_rules(state, RC.ADMIT, lambda rules: tuple(rule for rule in rules if rule.guard != "timeout_differs"))


def deadline_forgotten_at_admission() -> None:
    # An admission with a timeout is stored without its deadline.
    RUNS.effects["insert_timed"] = RUNS.effects["insert"]


def time_out_of_a_finished_run() -> None:
    # A Run that finished first is cancelled all the same once its deadline passed.
    for state in (RS.DONE, RS.FAILED):
        _run_rules(state, RC.TIME_OUT, lambda rules: RUNS.table[(RS.RUNNING, RC.TIME_OUT)])


_RUN_OPEN = (RS.QUEUED, RS.RUNNING, RS.AWAITING_HARDWARE, RS.AWAITING_CONSENT, RS.AWAITING_DELEGATE,
             RS.AWAITING_SERVICE, RS.AWAITING_TIMER)
_RUN_ALL = tuple(state for state in RS if state is not RS.ABSENT)


RUN_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (
        time_out_before_the_deadline,
        time_out_without_a_deadline,
        time_out_without_its_reason,
        replay_ignores_the_timeout,
        deadline_forgotten_at_admission,
        time_out_of_a_finished_run,
        timer_resumed_before_due,
        timer_due_time_moved_by_resume,
        claim_replayed_to_any_claimant,
        claim_records_the_node_not_the_claimant,
        retry_without_retries_left,
        result_kept_with_failure,
        resume_without_owner_check,
        claim_ignores_sequence,
        claim_serves_any_workflow,
        settle_over_cancelling,
        cancelled_without_containment,
        replay_reroutes,
    )
}


def second_verdict_wins() -> None:
    for state in (CS.GRANTED, CS.DENIED, CS.EXPIRED):
        CONSENTS.table[(state, CC.DECIDE)] = (
            Rule("verdict_granted", CS.GRANTED, "grant"),
            Rule("verdict_denied", CS.DENIED, "deny"),
            Rule("verdict_expired", CS.EXPIRED, "expire"),
            *CONSENTS.table[(state, CC.DECIDE)],
        )


def expire_before_the_deadline() -> None:
    # The deadline owner's expiry is taken whenever it is sent.
    CONSENTS.table[(CS.PENDING, CC.DECIDE)] = tuple(
        rule for rule in CONSENTS.table[(CS.PENDING, CC.DECIDE)] if rule.guard != "deadline_not_due")


def expire_a_second_early() -> None:
    # Off by a second: a deadline counts as passed one second before it.
    CONSENTS.guards["deadline_not_due"] = lambda record, command, now_us: (
        command.decided_by == DEADLINE_OWNER and not (
            command.verdict is ConsentStatus.EXPIRED and record.expires_at_us is not None
            and now_us + 1_000_000 >= record.expires_at_us))


def expire_without_a_deadline() -> None:
    # A consent without a deadline counts as due.
    CONSENTS.guards["deadline_not_due"] = lambda record, command, now_us: (
        command.decided_by == DEADLINE_OWNER and not (
            command.verdict is ConsentStatus.EXPIRED
            and (record.expires_at_us is None or now_us >= record.expires_at_us)))


CONSENT_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (second_verdict_wins, expire_before_the_deadline, expire_a_second_early, expire_without_a_deadline)
}


def result_adopted_twice() -> None:
    open_rules = AGENT_JOBS.table[(JS.RUNNING, JC.ADOPT_RESULT)]
    for state in (JS.SUCCEEDED, JS.FAILED, JS.CANCELLED, JS.TIMED_OUT, JS.LOST):
        AGENT_JOBS.table[(state, JC.ADOPT_RESULT)] = open_rules


def containment_overwrites_an_adopted_end() -> None:
    # record_cancelled turns an adopted end (a child's DONE adopted as succeeded) into cancelled.
    for state in (JS.SUCCEEDED, JS.FAILED, JS.TIMED_OUT):
        AGENT_JOBS.table[(state, JC.RECORD_CANCELLED)] = AGENT_JOBS.table[(JS.LOST, JC.RECORD_CANCELLED)]


AGENT_JOB_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant for mutant in (result_adopted_twice, containment_overwrites_an_adopted_end)}


def rotation_loses_resume_mode() -> None:
    rotate = RUNS.effects["rotate"]

    def effect(record: Any, command: Any, now_us: int) -> Any:
        decided = rotate(record, command, now_us)
        pair = decided.new_record
        fresh = replace_delivery(pair.deliveries[-1], resume=False)  # the mode guessed, not kept
        return Applied(RunPair(pair.run, (*pair.deliveries[:-1], fresh)), decided.reply)

    RUNS.effects["rotate"] = effect


RUN_MUTANTS[rotation_loses_resume_mode.__name__] = rotation_loses_resume_mode


# --- the message machine ----------------------------------------------------------------------

from tenure.kernel.messages.commands import MessageCommandType as MC  # noqa: E402
from tenure.kernel.messages.machine import MESSAGES  # noqa: E402
from tenure.kernel.messages.record import MessageStep as MS  # noqa: E402
from tenure.kernel.runs.machine import RESOLVED_OWNER_STATUSES  # noqa: E402
from tenure.model import WaitKind  # noqa: E402


def _message_rules(state: MS, command: MC, guard: str) -> None:
    MESSAGES.table[(state, command)] = tuple(
        rule for rule in MESSAGES.table[(state, command)] if rule.guard != guard)


def second_message_overwrites_the_first() -> None:
    # A send meeting a delivered slot delivers again: the receive's answer changes.
    MESSAGES.table[(MS.RECEIVED, MC.SEND)] = (Rule("always", MS.RECEIVED, "deliver"),)


def lost_hop_takes_a_message() -> None:
    _message_rules(MS.SENT, MC.RECEIVE, "hop_lost")


def timed_out_before_the_deadline() -> None:
    _message_rules(MS.PENDING, MC.TIME_OUT, "not_due")


def message_to_a_finished_run_stored() -> None:
    _message_rules(MS.ABSENT, MC.SEND, "run_finished")


def changed_message_replayed() -> None:
    # The replay compares nothing: another message under the same ID answers the first.
    MESSAGES.guards["message_differs"] = lambda record, command, now_us: False


def message_wait_resumed_by_a_cancelled_receive() -> None:
    # A cancelled receive counts as an answer: a Run resumes from its own sweep.
    RESOLVED_OWNER_STATUSES[WaitKind.MESSAGE] = frozenset({"received", "timed_out", "cancelled"})


MESSAGE_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (second_message_overwrites_the_first, lost_hop_takes_a_message, timed_out_before_the_deadline,
                   message_to_a_finished_run_stored, changed_message_replayed, message_wait_resumed_by_a_cancelled_receive)
}


# --- recovery ---------------------------------------------------------------------------------

from tenure.kernel.recovery import table as recovery  # noqa: E402
from tenure.kernel.recovery.table import Case as RK  # noqa: E402
from tenure.kernel.recovery.table import Pass as RP


def reconcile_touches_other_node() -> None:
    # An orphan is any hop claimed before the cutoff, whoever claimed it.
    recovery.GUARDS["not_orphan"] = lambda s: not (
        s.phase is RP.RECONCILE and s.cutoff_us is not None and s.delivery is not None
        and s.delivery.claimed_at_us is not None and s.delivery.claimed_at_us < s.cutoff_us
    )


def repark_without_snapshot_evidence() -> None:
    recovery.GUARDS["checkpoint_binds_latest"] = lambda s: s.latest_owner is not None


def republish_under_new_key() -> None:
    verdict = recovery._verdict

    def fresh_key(situation: Any, rule: Any) -> Any:
        decided = verdict(situation, rule)
        if decided.action is recovery.Action.REPUBLISH:
            return dataclasses.replace(decided, key=f"{decided.key}:retry")
        return decided

    recovery._verdict = fresh_key


def terminal_fence_of_a_live_hop() -> None:
    verdict = recovery._verdict

    def always_terminal(situation: Any, rule: Any) -> Any:
        decided = verdict(situation, rule)
        return dataclasses.replace(decided, terminal=True) if decided.action is recovery.Action.FENCE else decided

    recovery._verdict = always_terminal


def held_failed_by_relay() -> None:
    recovery.TABLE[(RK.HELD, RP.RELAY)] = (recovery.RecoveryRule("always", recovery.Action.FAIL_HELD),)


def settle_recorded_from_an_earlier_hop() -> None:
    # Any recorded outcome counts, whichever hop recorded it.
    recovery.GUARDS["outcome_recorded"] = lambda s: s.checkpoint_asked and s.outcome is not None


def lost_hop_retried_without_allowance() -> None:
    recovery.GUARDS["retry_left"] = lambda s: True


def retry_cancels_its_delegated_jobs_first() -> None:
    # The defect before REC-13: every open effect is contained before a retry, so a child
    # Run the hop that runs again would adopt is cancelled under it.
    recovery.GUARDS["retry_attempts_uncontained"] = lambda s: False
    recovery.GUARDS["retry_attempts_open"] = lambda s: False
    recovery.GUARDS["retry_left"] = lambda s: (s.run.hop_retries < s.run.max_hop_retries
                                               and (s.containment.proven or s.contained))


def retry_beside_an_open_attempt() -> None:
    # A retry that carries the service attempts too: the hop runs again beside an effect
    # its lost try may still be sending.
    recovery.GUARDS["retry_attempts_uncontained"] = lambda s: False
    recovery.GUARDS["retry_attempts_open"] = lambda s: False


def timer_resumed_by_a_relay_before_due() -> None:
    recovery.GUARDS["timer_due"] = lambda s: s.run.status.value == "awaiting_timer"


RECOVERY_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (reconcile_touches_other_node, repark_without_snapshot_evidence, republish_under_new_key,
                   held_failed_by_relay, terminal_fence_of_a_live_hop, settle_recorded_from_an_earlier_hop,
                   lost_hop_retried_without_allowance, retry_cancels_its_delegated_jobs_first,
                   retry_beside_an_open_attempt, timer_resumed_by_a_relay_before_due)
}


# --- workflow replay ---------------------------------------------------------------------------

from tenure.kernel.replay import table as replay  # noqa: E402
from tenure.kernel.replay.table import Case as PK  # noqa: E402


def recorded_answer_for_any_call() -> None:
    # The journal's entry answers whatever the workflow asks for at its position.
    replay.GUARDS["call_differs"] = lambda s: False


def missing_entry_before_the_wait_runs() -> None:
    # A position before the resumed wait that the journal lacks runs for real (a step
    # runs twice, a wait parks the Run again) instead of diverging.
    replay.TABLE[PK.BEFORE_WAIT] = (replay.ReplayRule("always", replay.Action.RUN, replay.Held.NOTHING),)


def owner_answers_any_call_at_its_position() -> None:
    # The resumed wait's owner answers whichever call reaches its position.
    replay.GUARDS["parked_call_differs"] = lambda s: False


REPLAY_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (recorded_answer_for_any_call, missing_entry_before_the_wait_runs,
                   owner_answers_any_call_at_its_position)
}


from tenure.kernel.nodes.commands import NodeCommandType as NC  # noqa: E402
from tenure.kernel.nodes.record import NodeStep as NS  # noqa: E402


def _node_rules(state: NS, command: NC, guard: str) -> None:
    NODES.table[(state, command)] = tuple(rule for rule in NODES.table[(state, command)] if rule.guard != guard)


def takeover_of_a_live_node() -> None:
    _node_rules(NS.LIVE, NC.TAKE_OVER, "lease_live")


def takeover_before_expiry() -> None:
    # Off by a second: a lease is counted as run out one second before its end.
    NODES.guards["lease_live"] = lambda record, command, now_us: now_us + 1_000_000 < record.lease_expires_at_us


def renewal_after_expiry() -> None:
    _node_rules(NS.LIVE, NC.RENEW, "lease_expired")


def stale_incarnation_renews() -> None:
    _node_rules(NS.LIVE, NC.RENEW, "epoch_differs")


def takeover_claim_stolen() -> None:
    _node_rules(NS.TAKING_OVER, NC.TAKE_OVER, "claim_live")


NODE_MUTANTS: dict[str, Callable[[], None]] = {
    mutant.__name__: mutant
    for mutant in (takeover_of_a_live_node, takeover_before_expiry, renewal_after_expiry, stale_incarnation_renews,
                   takeover_claim_stolen)
}


MUTANTS: dict[str, dict[str, Callable[[], None]]] = {
    "queue": QUEUE_MUTANTS,
    "attempts": ATTEMPT_MUTANTS,
    "runs": RUN_MUTANTS,
    "consent": CONSENT_MUTANTS,
    "agent_jobs": AGENT_JOB_MUTANTS,
    "recovery": RECOVERY_MUTANTS,
    "replay": REPLAY_MUTANTS,
    "nodes": NODE_MUTANTS,
    "messages": MESSAGE_MUTANTS,
}
"""Mutants by machine; ``TENURE_KERNEL_MUTANT=<machine>:<mutant>`` applies one."""

BEHAVIOURAL_TESTS: dict[str, list[str]] = {
    "queue": ["tests/kernel/test_queue_guarantees.py", "tests/kernel/test_finders.py",
              "tests/kernel/test_queue_properties.py"],
    "attempts": ["tests/kernel/test_attempt_guarantees.py"],
    "runs": ["tests/kernel/test_run_properties.py"],
    "consent": ["tests/kernel/test_run_properties.py"],
    "agent_jobs": ["tests/kernel/test_run_properties.py"],
    "recovery": ["tests/kernel/test_recovery_table.py::test_an_orphan_is_fenced_then_reparked_on_exact_checkpoint_evidence_else_contained_then_failed_lost",
                 "tests/kernel/test_recovery_table.py::test_another_nodes_hop_and_this_boots_hop_are_left_and_a_relay_never_fails_held",
                 "tests/kernel/test_recovery_table.py::test_a_queued_hop_is_published_republished_rotated_or_fenced_by_what_the_broker_says",
                 "tests/kernel/test_recovery_table.py::test_only_a_dead_processs_hop_is_fenced_terminally",
                 "tests/kernel/test_recovery_table.py::test_a_dead_hop_that_recorded_its_outcome_is_settled_with_it_after_fence_and_containment",
                 "tests/kernel/test_recovery_table.py::test_a_lost_hop_of_a_workflow_that_allows_retries_runs_again_until_none_is_left",
                 "tests/kernel/test_recovery_table.py::test_a_timer_wait_resumes_exactly_once_its_due_time_is_reached",
                 # Last: the broad property costs about a minute when it passes; with -x a
                 # mutant a targeted test above already caught never waits for it.
                 "tests/kernel/test_recovery_table.py::test_every_verdict_keeps_the_recovery_rules"],
    "replay": ["tests/kernel/test_replay_table.py::test_a_recorded_call_answers_from_the_journal_and_another_call_diverges_naming_both",
               "tests/kernel/test_replay_table.py::test_a_position_before_the_resumed_wait_that_the_journal_lacks_diverges_naming_nothing",
               "tests/kernel/test_replay_table.py::test_the_resumed_wait_answers_only_at_its_own_position_with_its_own_call",
               "tests/kernel/test_replay_table.py::test_a_position_past_the_wait_runs_for_real_only_where_the_journal_holds_nothing",
               "tests/kernel/test_replay_table.py::test_every_situation_of_a_small_world_gets_one_verdict_that_keeps_the_rules",
               "tests/kernel/test_replay_table.py::test_every_verdict_keeps_the_replay_rules"],
    "nodes": ["tests/kernel/test_node_properties.py"],
    "messages": ["tests/kernel/test_message_properties.py"],
}
"""The tests of behaviour each machine's mutants must fail (never the spec comparison,
which would catch every table edit without saying which guarantee broke)."""


def apply(name: str) -> None:
    machine, _, mutant = name.partition(":")
    MUTANTS[machine][mutant]()
