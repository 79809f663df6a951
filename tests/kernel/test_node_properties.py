"""The node lease kernel: properties of every decision over generated situations, and
each guarantee of specs/nodes.md as a plain example a reviewer can read. The node
mutants in kernel_mutants.py must make this file fail."""

from __future__ import annotations

from hypothesis import given, settings

from tenure.conformance.strategies.nodes import LEASE, NOW, node_row, node_situations
from tenure.kernel.core import Applied, Refused
from tenure.kernel.nodes.commands import Boot, Booted, FinishTakeover, Renew, TakeOver, TakingOver
from tenure.kernel.nodes.machine import NODES, NodeRefusal, transition_violations
from tenure.kernel.nodes.record import NodeStatus, record_violations

EXPIRES = NOW - 100 + LEASE  # node_row's lease end


@settings(max_examples=2000, deadline=None)
@given(node_situations())
def test_every_decision_keeps_the_transition_rules_and_the_record_invariants(situation: tuple) -> None:
    record, command, now = situation
    decision = NODES.decide(record, command, now)
    assert transition_violations(record, command, now, decision) == []
    if isinstance(decision, Applied):
        assert record_violations(decision.new_record) == []


@settings(max_examples=2000, deadline=None)
@given(node_situations())
def test_a_takeover_applies_exactly_when_the_read_incarnations_lease_ran_out_and_no_claim_holds(
    situation: tuple,
) -> None:
    record, command, now = situation
    if not isinstance(command, TakeOver) or record is None:
        return
    lease_ok = 0 < command.lease_us <= 3_600_000_000
    claim_free = record.status is NodeStatus.LIVE or (
        record.status is NodeStatus.TAKING_OVER and now >= record.takeover_until_us)
    expected = (lease_ok and record.status is not NodeStatus.TAKEN_OVER and command.taker != record.node
                and command.epoch == record.epoch and now >= record.lease_expires_at_us and claim_free)
    assert isinstance(NODES.decide(record, command, now), Applied) == expected


@settings(max_examples=2000, deadline=None)
@given(node_situations())
def test_a_renewal_applies_exactly_for_the_live_incarnation_before_its_lease_ran_out(situation: tuple) -> None:
    record, command, now = situation
    if not isinstance(command, Renew) or record is None:
        return
    expected = (0 < command.lease_us <= 3_600_000_000 and record.status is NodeStatus.LIVE
                and command.epoch == record.epoch and now < record.lease_expires_at_us)
    assert isinstance(NODES.decide(record, command, now), Applied) == expected


def test_a_live_lease_is_never_taken_over_not_even_a_microsecond_before_its_end() -> None:
    live = node_row()
    early = NODES.decide(live, TakeOver(taker="node-b", epoch=1, lease_us=LEASE), EXPIRES - 1)
    assert early == Refused(NodeRefusal.LEASE_LIVE)
    taken = NODES.decide(live, TakeOver(taker="node-b", epoch=1, lease_us=LEASE), EXPIRES)
    assert isinstance(taken, Applied) and taken.reply == TakingOver(1, EXPIRES)
    assert (taken.new_record.status, taken.new_record.taker) == (NodeStatus.TAKING_OVER, "node-b")


def test_a_lease_renewed_in_time_moves_and_one_renewed_late_needs_a_new_boot() -> None:
    live = node_row()
    renewed = NODES.decide(live, Renew(epoch=1, lease_us=LEASE), EXPIRES - 1)
    assert isinstance(renewed, Applied) and renewed.new_record.lease_expires_at_us == EXPIRES - 1 + LEASE
    assert NODES.decide(live, Renew(epoch=1, lease_us=LEASE), EXPIRES) == Refused(NodeRefusal.LEASE_EXPIRED)
    booted = NODES.decide(live, Boot(node="node-a", lease_us=LEASE), EXPIRES + 5)
    assert isinstance(booted, Applied) and booted.reply == Booted(2, EXPIRES + 5)
    assert NODES.decide(booted.new_record, Renew(epoch=1, lease_us=LEASE), EXPIRES + 6) == Refused(NodeRefusal.STALE_EPOCH)


def test_a_takeover_claim_holds_until_it_runs_out_and_only_its_taker_finishes_it() -> None:
    taking = NODES.decide(node_row(), TakeOver(taker="node-b", epoch=1, lease_us=LEASE), EXPIRES).new_record
    assert NODES.decide(taking, TakeOver(taker="node-c", epoch=1, lease_us=LEASE), EXPIRES + LEASE - 1) == Refused(
        NodeRefusal.TAKEOVER_IN_PROGRESS)
    replaced = NODES.decide(taking, TakeOver(taker="node-c", epoch=1, lease_us=LEASE), EXPIRES + LEASE)
    assert isinstance(replaced, Applied) and replaced.new_record.taker == "node-c"  # the first taker died
    assert NODES.decide(replaced.new_record, FinishTakeover(taker="node-b", epoch=1), EXPIRES + LEASE) == Refused(
        NodeRefusal.NOT_TAKER)
    done = NODES.decide(replaced.new_record, FinishTakeover(taker="node-c", epoch=1), EXPIRES + LEASE + 1)
    assert isinstance(done, Applied) and done.new_record.status is NodeStatus.TAKEN_OVER
    assert NODES.decide(done.new_record, Renew(epoch=1, lease_us=LEASE), EXPIRES + LEASE + 2) == Refused(
        NodeRefusal.NOT_LIVE)


def test_a_node_never_takes_itself_over_and_a_newer_boot_is_not_taken_over_for_an_old_one() -> None:
    assert NODES.decide(node_row(), TakeOver(taker="node-a", epoch=1, lease_us=LEASE), EXPIRES) == Refused(
        NodeRefusal.OWN_NODE)
    rebooted = node_row(epoch=2)
    assert NODES.decide(rebooted, TakeOver(taker="node-b", epoch=1, lease_us=LEASE), EXPIRES) == Refused(
        NodeRefusal.STALE_EPOCH)
