"""The Run aggregate's declaration (``tenure.kernel.runs.aggregate``): the same as the
table in specs/runs.md both ways, complete, and in agreement with the kernel's own rules
(which replies sweep consents, which fields a reading fills)."""

from __future__ import annotations

import dataclasses

import paths
from hypothesis import given, settings
from hypothesis import strategies as st

from tenure.conformance.strategies.runs import run_situations
from tenure.kernel.core import Applied, decide
from tenure.kernel.runs.machine import RUNS

from tenure.kernel.runs import commands
from tenure.kernel.runs.aggregate import (
    AFTER_COMMIT,
    COUNTED_AHEAD,
    COUNTED_WITH_PAIR,
    DECIDED_AHEAD,
    IDLE_WHEN_NONE_COUNTED,
    FILLS,
    FOLLOW_UPS,
    OWNER_COMMANDS,
    READS,
    UNREAD_CONTAINMENT,
    Evidence,
    FollowUp,
    after_commit,
    in_transaction,
    left_for_transaction,
)
from tenure.kernel.runs.commands import RunCommandType, Settled, Swept
from tenure.kernel.runs.machine import CANCELLED_BY, SETTLED_BY, RunRefusal, consent_sweep

SPEC = paths.ROOT / "specs" / "runs.md"
HEADER = ["command", "reads under the Run's lock", "reply", "in the transaction", "after commit"]
OWNER_HEADER = ["owner command", "reads", "after commit"]


def _table(header: list[str]) -> list[list[str]]:
    rows: list[list[str]] = []
    inside = False
    for line in SPEC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            inside = False
            continue
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")]
        if cells == header:
            inside = True
        elif inside and not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows


def _names(values: tuple[object, ...] | list[object]) -> str:
    return ", ".join(value.value for value in values) if values else "none"  # type: ignore[attr-defined]


def _kernel_rows() -> list[list[str]]:
    rows = []
    for command, reads in READS.items():
        replies = FOLLOW_UPS[command]
        if not replies:
            rows.append([command.value, _names(reads), "any", "none", "none"])
        for reply, steps in replies.items():
            name = reply.__name__ if isinstance(reply, type) else f"refused {reply.value}"
            rows.append([command.value, _names(reads), name,
                         _names([step for step in steps if step not in AFTER_COMMIT]),
                         _names([step for step in steps if step in AFTER_COMMIT])])
    return rows


def test_the_spec_aggregate_table_is_the_kernel_declaration_in_the_same_order() -> None:
    assert _table(HEADER) == _kernel_rows()


def test_the_spec_owner_table_is_the_kernel_declaration_in_the_same_order() -> None:
    kernel = [[command.value, ", ".join(reads), _names(steps)] for command, (reads, steps) in OWNER_COMMANDS.items()]
    assert _table(OWNER_HEADER) == kernel


def test_every_run_command_is_declared_and_reads_its_pair() -> None:
    assert set(READS) == set(FOLLOW_UPS) == set(RunCommandType)
    for command, reads in READS.items():
        assert Evidence.PAIR in reads, command
        assert len(set(reads)) == len(reads), command
    assert set(FILLS) == set(Evidence)


def test_every_filled_field_exists_on_the_commands_that_read_it() -> None:
    by_kind = {cls.kind: cls for cls in commands.RunCommand.__args__}  # type: ignore[attr-defined]
    for command, reads in READS.items():
        fields = {field.name for field in dataclasses.fields(by_kind[command])}
        for evidence in reads:
            if FILLS[evidence] is not None:
                assert FILLS[evidence] in fields, (command, evidence)


def test_the_declaration_sweeps_consents_exactly_where_the_kernel_names_a_sweep() -> None:
    replies = [Settled(SETTLED_BY), Settled(CANCELLED_BY), Swept(CANCELLED_BY), commands.Ack(), commands.Ticket(0, False),
               commands.Rotated(1), commands.Resumed(1), commands.Claimed(0, False), commands.Admitted(True)]
    for sweep in (FollowUp.SWEEP_CONSENTS, FollowUp.SWEEP_RECEIVES):
        for command in RunCommandType:
            for reply in replies:
                declared = sweep in in_transaction(command, reply)
                if declared:
                    assert consent_sweep(reply) is not None, (command, reply)
        # Every command whose replies the kernel sweeps on declares the sweep: a
        # consent, and a receive, never wait on a Run that will not resume.
        assert sweep in in_transaction(RunCommandType.SETTLE, Settled(SETTLED_BY))
        assert sweep in in_transaction(RunCommandType.FINISH_CANCEL, Settled(CANCELLED_BY))
        assert sweep in in_transaction(RunCommandType.FINISH_CANCEL, Swept(CANCELLED_BY))


def test_follow_ups_split_into_the_transaction_and_after_commit() -> None:
    settled = Settled(SETTLED_BY)
    assert in_transaction(RunCommandType.SETTLE, settled) == (FollowUp.SWEEP_CONSENTS, FollowUp.SWEEP_RECEIVES,
                                                              FollowUp.DELETE_CHECKPOINT)
    assert after_commit(RunCommandType.SETTLE, settled) == ()
    assert after_commit(RunCommandType.RESUME, commands.Resumed(2)) == (FollowUp.PUBLISH_HOP,)
    assert in_transaction(RunCommandType.RETRY_LOST, commands.Rotated(2)) == (FollowUp.CLEAR_OUTCOME,)
    assert after_commit(RunCommandType.CLAIM, commands.Claimed(0, False)) == ()


def test_the_unread_containment_placeholder_is_unproven() -> None:
    assert not UNREAD_CONTAINMENT.proven


@settings(max_examples=300)
@given(data=st.data())
def test_every_command_decided_ahead_reads_only_the_pair_and_writes_its_two_rows_in_place(data: st.DataObject) -> None:
    # What the joined decided-ahead statement can do: lock, compare and write the Run and
    # its current delivery; no other reading, no follow-up inside the transaction, no
    # delivery opened or removed.
    kind = data.draw(st.sampled_from(sorted(DECIDED_AHEAD, key=lambda each: each.value)))
    assert READS[kind] == (Evidence.PAIR,)
    assert all(not set(steps) - AFTER_COMMIT for steps in FOLLOW_UPS[kind].values())
    record, command, now = data.draw(run_situations(None, kind))
    decision = decide(RUNS, record, command, now)
    if isinstance(decision, Applied) and record is not None:
        new = decision.new_record
        assert new is not None
        assert [row.delivery_id for row in new.deliveries] == [row.delivery_id for row in record.deliveries]


def test_every_command_decided_ahead_on_counts_reads_the_pair_and_counts_and_starts_from_each_of_them() -> None:
    # What the counted decided-ahead statement can read: the pair and counts; it starts
    # from a value for every count the command reads, and from nothing else.
    for kind, start in COUNTED_AHEAD.items():
        assert READS[kind][0] is Evidence.PAIR and set(READS[kind][1:]) <= COUNTED_WITH_PAIR
        assert set(start) == set(READS[kind][1:])
    assert set(IDLE_WHEN_NONE_COUNTED.values()) <= COUNTED_WITH_PAIR


def test_a_follow_up_idle_on_counts_is_left_for_the_transaction_once_its_count_is_not_zero() -> None:
    settle = commands.RunCommandType.SETTLE
    reply = Settled(SETTLED_BY)
    none = {Evidence.PENDING_CONSENTS: (0,), Evidence.PENDING_RECEIVES: (0,)}
    assert left_for_transaction(settle, reply, none) == ()
    assert left_for_transaction(settle, reply, {**none, Evidence.PENDING_CONSENTS: (2,)}) == (FollowUp.SWEEP_CONSENTS,)
    assert left_for_transaction(settle, reply, {**none, Evidence.PENDING_RECEIVES: (1,)}) == (FollowUp.SWEEP_RECEIVES,)
    assert left_for_transaction(settle, reply, {}) == (FollowUp.SWEEP_CONSENTS, FollowUp.SWEEP_RECEIVES)


@settings(max_examples=300)
@given(data=st.data())
def test_every_command_decided_ahead_on_its_starting_counts_is_done_whole_by_the_statement(
    data: st.DataObject,
) -> None:
    # Decided on the counts the declaration starts from (the common case), a command sets
    # off nothing the statement does not do (no sweep, no outcome recorded), is never
    # refused for its counts, and writes the pair's two rows in place.
    kind = data.draw(st.sampled_from(sorted(COUNTED_AHEAD, key=lambda each: each.value)))
    record, command, now = data.draw(run_situations(None, kind))
    start = COUNTED_AHEAD[kind]
    if Evidence.CONTAINMENT in start:
        jobs, attempts = start[Evidence.CONTAINMENT]
        command = dataclasses.replace(command, containment=commands.Containment(open_jobs=jobs, open_attempts=attempts))
    decision = decide(RUNS, record, command, now)
    if isinstance(decision, Applied):
        assert left_for_transaction(kind, decision.reply, start) == ()
        if record is not None and decision.new_record is not None:
            assert [row.delivery_id for row in decision.new_record.deliveries] == [
                row.delivery_id for row in record.deliveries]
    else:
        assert left_for_transaction(kind, None, start, refused=RunRefusal(decision.reason.value)) == ()
