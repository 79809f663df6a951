"""Deciding ahead (tenure.kernel.ahead), for every registered machine: the window a
decision made ahead carries is exactly where its guards hold, the decision at every
instant inside it equals the ordinary decision, and its record keeps the invariants
throughout. One suite, parameterized by machine (tests/support/machines.py)."""

from __future__ import annotations

from typing import Any, NamedTuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from machines import MACHINES, MachineUnderTest

from tenure.kernel.ahead import DEFAULT_SPAN_US, Ahead, AheadUnsupported, Moment, Window, decide_ahead, decide_windowed
from tenure.kernel.core import Applied, SetOnce, decide, select_rule

MACHINE_NAMES = sorted(MACHINES)
DECLARING = sorted(name for name, under_test in MACHINES.items() if under_test.machine.time_guards is not None)
"""Machines that declare their time guards and moving fields (the fast path reads them)."""


def _situation(under_test: MachineUnderTest, data: st.DataObject, **where: Any) -> tuple[Any, Any, int]:
    """A situation (in a state and of a command kind ``where`` names, if it does) whose
    time is often right at one of the record's instants (where a guard flips), not only
    where the machine's strategy put it."""
    record, command, now = data.draw(under_test.situations(**where))
    if record is not None:
        instants = sorted(_instants(record))
        if instants:
            edge = data.draw(st.sampled_from(instants), label="edge")
            now = data.draw(st.sampled_from([now, edge - 1, edge, edge + 1]), label="now")
    return record, command, now


def vars_of(record: Any) -> dict[str, Any]:
    return {field: getattr(record, field) for field in record.__dataclass_fields__}


def _instants(record: Any) -> set[int]:
    """Every instant of ``record``, down into the rows it nests (the Run pair's Run and
    deliveries): where a time guard may flip or a time that never moves backwards stops."""
    found: set[int] = set()
    for field, value in vars_of(record).items():
        if field.endswith("_us") and type(value) is int:
            found.add(value)
        elif hasattr(value, "__dataclass_fields__"):
            found |= _instants(value)
        elif type(value) is tuple:
            for part in value:
                if hasattr(part, "__dataclass_fields__"):
                    found |= _instants(part)
    return found


def _violations(under_test: MachineUnderTest, record: Any) -> set[str]:
    return set(under_test.machine.record_violations(record)) if record is not None else set()


def _made_ahead(under_test: MachineUnderTest, record: Any, command: Any, now: int) -> Ahead | None:
    """The decision made ahead, or None where the machine may decline: a machine whose
    record nests rows makes only the decisions that leave its record unchanged ahead."""
    ahead = decide_ahead(under_test.machine, record, command, now)
    if ahead is None and not under_test.decides_every_change_ahead:
        ordinary = decide(under_test.machine, record, command, now)
        assert isinstance(ordinary, Applied) and ordinary.new_record != record, "only a change may be declined"
        return None
    assert ahead is not None, "every decision of this machine can be made ahead"
    return ahead


class DrawnAhead(NamedTuple):
    """A situation with its decision made ahead (:func:`_drawn_ahead`)."""

    under_test: MachineUnderTest
    record: Any
    command: Any
    now: int
    ahead: Ahead


def _drawn_ahead(name: str, data: st.DataObject) -> DrawnAhead | None:
    """A situation of the machine ``name`` (:func:`_situation`: its time often at an
    edge) with its decision made ahead, or None where the machine may decline to make it
    ahead (:func:`_made_ahead`): the one way the properties of a decision made ahead
    draw what they check."""
    under_test = MACHINES[name]
    record, command, now = _situation(under_test, data)
    ahead = _made_ahead(under_test, record, command, now)
    return None if ahead is None else DrawnAhead(under_test, record, command, now, ahead)


def _assert_the_declarations_agree_with_the_instrumented_reference(machine: Any, record: Any, command: Any,
                                                                    now: int) -> None:
    """The decision read from the declared time guards and moving fields
    (:func:`decide_windowed`) equals the one instrumenting every comparison finds
    (:func:`decide_ahead`); where the declared path declines, so does the reference, or
    the rule's effect declares no moving fields."""
    windowed = decide_windowed(machine, record, command, now)
    instrumented = decide_ahead(machine, record, command, now)
    if windowed is None:
        outcome = select_rule(machine, record, command, now).outcome
        assert instrumented is None or (isinstance(outcome, str) and outcome not in machine.moving_fields), outcome
        return
    assert windowed == instrumented


@pytest.mark.parametrize("name", MACHINE_NAMES)
@settings(max_examples=400)
@given(data=st.data())
def test_a_decision_made_ahead_equals_the_ordinary_decision_everywhere_in_its_window(
    name: str, data: st.DataObject
) -> None:
    drawn = _drawn_ahead(name, data)
    if drawn is None:
        return
    under_test, record, command, now, ahead = drawn
    machine = under_test.machine
    start, end = ahead.not_before_us, ahead.not_after_us
    assert start <= now < end
    assert now - DEFAULT_SPAN_US <= start and end <= now + DEFAULT_SPAN_US
    assert ahead.rule_not_before_us <= start and end <= ahead.rule_not_after_us
    inside = data.draw(st.integers(start, end - 1), label="inside")
    allowed = _violations(under_test, record)
    for instant in {start, end - 1, inside, now}:
        assert ahead.at(instant) == decide(machine, record, command, instant), instant
        decided = ahead.at(instant)
        if isinstance(decided, Applied) and decided.new_record is not None:
            assert _violations(under_test, decided.new_record) <= allowed, instant


def test_the_queue_and_the_run_machine_declare_their_time_guards() -> None:
    # The fast path's machines: the test below must not pass vacuously.
    assert "queue" in DECLARING and "runs" in DECLARING


def test_the_run_machine_declares_every_command_it_decides_ahead() -> None:
    """Every effect a Run command decided ahead on PostgreSQL can reach has its moving
    fields declared: the hot path never instruments its comparisons."""
    from tenure.kernel.runs.aggregate import ADMITTED_AHEAD, DECIDED_AHEAD
    from tenure.kernel.runs.machine import RUNS

    assert RUNS.moving_fields is not None
    reached = {rule.outcome for (_, kind), rules in RUNS.table.items() if kind in DECIDED_AHEAD | ADMITTED_AHEAD
               for rule in rules if isinstance(rule.outcome, str)}
    assert reached and reached <= set(RUNS.moving_fields), sorted(reached - set(RUNS.moving_fields))


@pytest.mark.parametrize("name", DECLARING)
@settings(max_examples=600)
@given(data=st.data())
def test_a_decision_read_from_the_declarations_equals_the_instrumented_one(name: str, data: st.DataObject) -> None:
    """The declared time guards and moving fields say exactly what instrumenting every
    comparison finds: the same decision, window, offsets and invariant check (a guard
    or an effect that reads the time without a declaration narrows the instrumented
    window and fails here)."""
    record, command, now = _situation(MACHINES[name], data)
    _assert_the_declarations_agree_with_the_instrumented_reference(MACHINES[name].machine, record, command, now)


def _reading_the_time(name: str) -> list[tuple[Any, Any]]:
    """The (state, command kind) pairs whose rules try a declared time guard or apply an
    effect with a field set only once (:class:`SetOnce`: a claim of a Run that ran
    before keeps its first start): both too rare among all the situations. A
    :class:`KeptLater` field is everywhere (a Run's ``updated_at``) and the situations
    put the time at its edge often."""
    machine = MACHINES[name].machine
    assert machine.time_guards is not None and machine.moving_fields is not None
    moving = machine.moving_fields

    def reads(rule: Any) -> bool:
        return rule.guard in machine.time_guards or any(
            type(field) is SetOnce for field in moving.get(rule.outcome, ()) if isinstance(rule.outcome, str))

    return sorted(((state, kind) for (state, kind), rules in machine.table.items() if any(map(reads, rules))), key=str)


@pytest.mark.parametrize("name", DECLARING)
@settings(max_examples=300)
@given(data=st.data())
def test_a_decision_read_from_the_declarations_equals_the_instrumented_one_where_a_time_guard_is_tried(
    name: str, data: st.DataObject
) -> None:
    """The same, in the states and for the commands whose rules read the time (a Run's
    timer resume is too rare among all the situations to hold its declaration)."""
    state, kind = data.draw(st.sampled_from(_reading_the_time(name)), label="where")
    record, command, now = _situation(MACHINES[name], data, state=state, kind=kind)
    _assert_the_declarations_agree_with_the_instrumented_reference(MACHINES[name].machine, record, command, now)


@pytest.mark.parametrize("name", MACHINE_NAMES)
@settings(max_examples=400)
@given(data=st.data())
def test_the_guards_flip_at_the_edges_of_the_window_they_imply(name: str, data: st.DataObject) -> None:
    drawn = _drawn_ahead(name, data)
    if drawn is None:
        return
    under_test, record, command, now, ahead = drawn
    machine = under_test.machine
    rule = select_rule(machine, record, command, now)
    if ahead.rule_not_before_us > now - DEFAULT_SPAN_US:
        assert select_rule(machine, record, command, ahead.rule_not_before_us - 1) != rule
    if ahead.rule_not_after_us < now + DEFAULT_SPAN_US:
        assert select_rule(machine, record, command, ahead.rule_not_after_us) != rule


@pytest.mark.parametrize("name", MACHINE_NAMES)
@settings(max_examples=200)
@given(data=st.data())
def test_the_time_dependent_fields_of_a_decision_made_ahead_move_with_the_time(
    name: str, data: st.DataObject
) -> None:
    drawn = _drawn_ahead(name, data)
    if drawn is None or not drawn.ahead.relative:
        return
    _, _, _, now, ahead = drawn
    later = data.draw(st.integers(now, ahead.not_after_us - 1), label="later")
    at_now, at_later = ahead.at(now), ahead.at(later)
    assert isinstance(at_now, Applied) and isinstance(at_later, Applied)
    for path, offset in ahead.relative.items():
        assert _at_path(at_now.new_record, path) == now + offset
        assert _at_path(at_later.new_record, path) == later + offset


def _at_path(record: Any, path: str) -> Any:
    """The field a path of :attr:`Ahead.relative` names (``deliveries.0.claimed_at_us``)."""
    for step in path.split("."):
        record = record[int(step)] if step.isdigit() else getattr(record, step)
    return record


def test_a_change_to_a_record_that_nests_rows_moves_its_nested_times_with_the_clock() -> None:
    # The Run pair nests its rows: a claim's times sit inside the Run and its delivery;
    # the window's offsets reach them by their paths, so the claim is made ahead and,
    # at every instant of its window, equals the ordinary decision.
    from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
    from tenure.kernel.runs.commands import Claim, Release
    from tenure.kernel.runs.machine import RUNS
    from tenure.kernel.runs.record import RunPair
    from tenure.model import DeliveryState

    run = base_run()
    pair = RunPair(run, (delivery_for(run, DeliveryState.PUBLISHED),))
    claim = Claim(enqueue_seq=0, node="node-a")
    ahead = decide_ahead(RUNS, pair, claim, NOW)
    assert ahead is not None
    assert ahead.relative == {"run.started_at_us": 0, "run.updated_at_us": 0, "deliveries.0.claimed_at_us": 0}
    assert ahead.not_before_us == run.updated_at_us + 1  # updated_at never moves backwards
    for instant in (ahead.not_before_us, NOW, ahead.not_after_us - 1):
        assert ahead.at(instant) == decide(RUNS, pair, claim, instant)
    refused = decide_ahead(RUNS, pair, Release(enqueue_seq=0), NOW)  # not held: a refusal, made ahead
    assert refused is not None and refused.decision == decide(RUNS, pair, Release(enqueue_seq=0), NOW)


# --- the Moment itself ---------------------------------------------------------------------


def _moment(reference: int = 1_000, offset: int = 0) -> tuple[Moment, Window]:
    window = Window(0, 10_000)
    return Moment(reference + offset, offset, window), window


@pytest.mark.parametrize(
    ("compare", "holds", "window"),
    [
        (lambda m: m < 1_500, True, (0, 1_500)),
        (lambda m: m < 900, False, (900, 10_000)),
        (lambda m: m <= 1_500, True, (0, 1_501)),
        (lambda m: m <= 900, False, (901, 10_000)),
        (lambda m: m > 900, True, (901, 10_000)),
        (lambda m: m > 1_500, False, (0, 1_501)),
        (lambda m: m >= 900, True, (900, 10_000)),
        (lambda m: m >= 1_500, False, (0, 1_500)),
        (lambda m: 1_500 > m, True, (0, 1_500)),
        (lambda m: 900 <= m, True, (900, 10_000)),
        (lambda m: m == 1_000, True, (1_000, 1_001)),
        (lambda m: m == 900, False, (901, 10_000)),
        (lambda m: m == 1_500, False, (0, 1_500)),
        (lambda m: m + 100 < 1_050, False, (950, 10_000)),
        (lambda m: m - 100 >= 950, False, (0, 1_050)),
        (lambda m: max(800, m) == m, True, (801, 10_000)),
    ],
)
def test_each_comparison_with_the_time_narrows_the_window_to_where_it_holds(
    compare: Any, holds: bool, window: tuple[int, int]
) -> None:
    moment, recorded = _moment()
    assert compare(moment) is holds
    assert (recorded.start, recorded.end) == window


def test_adding_a_duration_keeps_the_dependency_and_subtracting_two_times_drops_it() -> None:
    moment, window = _moment()
    lease = moment + 60
    assert isinstance(lease, Moment) and lease.offset == 60 and int(lease) == 1_060
    assert type(lease - moment) is int and lease - moment == 60
    assert (lease - 10).offset == 50
    assert (lease < moment + 61) is True and (window.start, window.end) == (0, 10_000)


@pytest.mark.parametrize(
    "use",
    [lambda m: m * 2, lambda m: m // 1000, lambda m: 5 - m, lambda m: -m, lambda m: str(m), lambda m: f"{m}",
     lambda m: float(m), lambda m: m + 1.5, lambda m: bool(m)],
)
def test_any_other_use_of_the_time_is_refused_rather_than_hidden(use: Any) -> None:
    moment, _ = _moment()
    with pytest.raises(AheadUnsupported):
        use(moment)


def _shifting_keeps_the_invariants(machine: Any, record: Any, command: Any, now: int, shift: int) -> bool:
    """Whether the decision's new record breaks the same invariants with every field its
    effect moves with the time shifted by ``shift`` (as far as the instant bounds allow,
    and where every order the machine declares, :attr:`Machine.moving_field_orders`,
    says the same as before the shift)."""
    from tenure.kernel.ahead import at_path, moved
    from tenure.model.bounds import is_instant

    rule = select_rule(machine, record, command, now)
    decided = decide(machine, record, command, now)
    fields = machine.moving_fields.get(rule.outcome, ()) if isinstance(rule.outcome, str) else ()
    if not isinstance(decided, Applied) or decided.new_record is None or not fields:
        return True
    new = decided.new_record
    paths = [field if isinstance(field, str) else field.field for field in fields]
    offsets = {path: at_path(new, path) - now for path in paths if type(at_path(new, path)) is int}
    shifted = moved(new, offsets, now + shift)
    if not all(is_instant(at_path(shifted, path)) for path in offsets):
        return True  # past the bounds: the bounds check refuses it at the edge
    for first, second in machine.moving_field_orders:
        values = [(at_path(row, first), at_path(row, second)) for row in (new, shifted)]
        if None not in values[0] and (values[0][0] <= values[0][1]) != (values[1][0] <= values[1][1]):
            return True  # a declared order flips: decided ahead, both edges are checked whole
    return set(machine.record_violations(shifted)) == set(machine.record_violations(new))


@pytest.mark.parametrize("name", [name for name in DECLARING if MACHINES[name].machine.invariants_see_moving_fields_by_bounds])
@settings(max_examples=400)
@given(data=st.data())
def test_the_invariants_see_the_moving_fields_only_through_their_bounds(name: str, data: st.DataObject) -> None:
    """What lets the fast path check the invariants once per decision
    (``Machine.invariants_see_moving_fields_by_bounds`` and ``Machine.moving_field_orders``)."""
    machine = MACHINES[name].machine
    record, command, now = _situation(MACHINES[name], data)
    shift = data.draw(st.sampled_from([-DEFAULT_SPAN_US, -1, 1, DEFAULT_SPAN_US]) | st.integers(-DEFAULT_SPAN_US, DEFAULT_SPAN_US))
    assert _shifting_keeps_the_invariants(machine, record, command, now, shift)


def test_both_the_queue_and_the_run_machine_check_their_invariants_once_per_decision() -> None:
    # The property above must not pass vacuously for either hot path.
    names = [name for name in DECLARING if MACHINES[name].machine.invariants_see_moving_fields_by_bounds]
    assert "queue" in names and "runs" in names


def _counting_violations(machine: Any) -> tuple[Any, list[Any]]:
    """``machine`` with its record invariants counting the records they are asked about."""
    import dataclasses

    asked: list[Any] = []

    def counted(record: Any) -> list[str]:
        asked.append(record)
        return machine.record_violations(record)

    return dataclasses.replace(machine, record_violations=counted), asked


HOT_RUN_COMMANDS = ["claim", "record_published", "settle"]


def _hot_run_decision(command_name: str) -> tuple[Any, Any, Any]:
    """The queued Run of the hot-path tests, and the pair and the command of the Run's hot
    path ``command_name`` (a claim, a publication, a settle) that applies to it."""
    from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
    from tenure.kernel.runs.commands import Claim, Containment, RecordPublished, Settle
    from tenure.kernel.runs.record import RunPair
    from tenure.model import DeliveryState, RunStatus

    queued = base_run()
    running = base_run(status=RunStatus.RUNNING, started_at_us=NOW - 50, node="node-a")
    pair, command = {
        "claim": (RunPair(queued, (delivery_for(queued, DeliveryState.PUBLISHED),)), Claim(enqueue_seq=0, node="node-a")),
        "record_published": (RunPair(queued, (delivery_for(queued, DeliveryState.PENDING),)), RecordPublished(enqueue_seq=0)),
        "settle": (RunPair(running, (delivery_for(running, DeliveryState.CLAIMED),)),
                   Settle(enqueue_seq=0, status=RunStatus.DONE, error=None,
                          containment=Containment(open_jobs=0, open_attempts=0))),
    }[command_name]
    return queued, pair, command


@pytest.mark.parametrize("command_name", HOT_RUN_COMMANDS)
def test_a_run_decision_read_from_the_declarations_checks_the_invariants_once(command_name: str) -> None:
    """The Run's hot path (a claim, a publication, a settle) holds its new pair to the
    invariants once, at the reference time, with the bounds and INV-R9's order at both
    edges, instead of the whole invariants at each edge (twice): the same answer
    (tests above), half the work."""
    from tenure.conformance.strategies.runs import NOW
    from tenure.kernel.runs.machine import RUNS

    _, pair, command = _hot_run_decision(command_name)
    counting, asked = _counting_violations(RUNS)
    windowed = decide_windowed(counting, pair, command, NOW)
    assert windowed is not None and windowed.invariants_checked and isinstance(windowed.decision, Applied)
    assert windowed == decide_ahead(RUNS, pair, command, NOW)
    assert asked == [windowed.decision.new_record], "checked once, at the reference time"


@pytest.mark.parametrize("command_name", HOT_RUN_COMMANDS)
def test_a_run_decision_on_the_hot_path_copies_its_rows_without_dataclasses_replace(
    command_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Run's effects copy a row through its slots (``replace_run``/``replace_delivery``
    use :func:`~tenure.kernel.core.replaced`, as the queue's ``replace_fields`` does), not
    through ``dataclasses.replace``'s per-call introspection; a field the row does not
    have is still refused."""
    import dataclasses

    from tenure.conformance.strategies.runs import NOW
    from tenure.kernel.runs.machine import RUNS
    from tenure.kernel.runs.record import replace_delivery, replace_run

    queued, pair, command = _hot_run_decision(command_name)
    expected = decide_ahead(RUNS, pair, command, NOW)

    def introspecting(*_: Any, **__: Any) -> Any:
        raise AssertionError("dataclasses.replace on the hot path")

    monkeypatch.setattr(dataclasses, "replace", introspecting)
    windowed = decide_windowed(RUNS, pair, command, NOW)
    assert windowed is not None and windowed == expected
    monkeypatch.undo()
    assert replace_run(queued, node="node-b") == dataclasses.replace(queued, node="node-b")
    with pytest.raises(AssertionError):
        replace_run(queued, nodes="node-b")
    with pytest.raises(AssertionError):
        replace_delivery(pair.current, node="node-b")


def test_a_run_order_left_undeclared_is_caught_by_the_shifting_property() -> None:
    """The mutant the Run's declared order exists for: a claim moves ``updated_at`` and
    keeps ``created_at``; shifted back past ``created_at`` it breaks INV-R9, which a
    check at the reference time alone would miss."""
    import dataclasses

    from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
    from tenure.kernel.runs.commands import Claim
    from tenure.kernel.runs.machine import RUNS
    from tenure.kernel.runs.record import RunPair
    from tenure.model import DeliveryState

    queued = base_run()
    pair = RunPair(queued, (delivery_for(queued, DeliveryState.PUBLISHED),))
    claim, shift = Claim(enqueue_seq=0, node="node-a"), -1_000
    assert _shifting_keeps_the_invariants(RUNS, pair, claim, NOW, shift)
    undeclared = dataclasses.replace(RUNS, moving_field_orders=())
    assert not _shifting_keeps_the_invariants(undeclared, pair, claim, NOW, shift)


def test_a_run_decision_whose_declared_order_flips_inside_its_window_is_checked_at_both_edges() -> None:
    """A pair already out of order (created after updated, INV-R9 broken as read) whose
    claim moves ``updated_at`` across ``created_at`` inside the window: the order flips,
    so the declared path checks the invariants at both edges whole, as the reference does."""
    from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
    from tenure.kernel.runs.commands import Claim
    from tenure.kernel.runs.machine import RUNS
    from tenure.kernel.runs.record import RunPair
    from tenure.model import DeliveryState

    queued = base_run(created_at_us=NOW - 10, updated_at_us=NOW - 100)
    pair = RunPair(queued, (delivery_for(queued, DeliveryState.PUBLISHED),))
    claim = Claim(enqueue_seq=0, node="node-a")
    counting, asked = _counting_violations(RUNS)
    windowed = decide_windowed(counting, pair, claim, NOW)
    assert windowed is not None and windowed.not_before_us < queued.created_at_us < windowed.not_after_us
    assert windowed == decide_ahead(RUNS, pair, claim, NOW)
    assert len(asked) > 1, "both edges checked whole"


# --- mutants of the declarations: the suite above must catch each -------------------------


def _claimed_queue_row() -> tuple[Any, Any, int]:
    from test_queue_guarantees import LEASE, NOW, claimed

    from tenure.kernel.queue.commands import ClaimFence, HeartbeatOwned

    record = claimed()
    fence = ClaimFence(queue=record.queue, job_id=record.job_id, owner_id=record.owner_id,
                       generation=record.generation, claim_token=record.claim_token)
    return record, HeartbeatOwned(fence=fence, lease_us=LEASE), NOW


@pytest.mark.parametrize("mutant", ["window from the wrong guard", "time guard undeclared", "moving field undeclared"])
def test_a_wrong_declaration_is_caught_by_the_instrumented_reference(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tenure.kernel.core import TimeGuard
    from tenure.kernel.queue import machine as queue_machine

    if mutant == "window from the wrong guard":
        monkeypatch.setitem(queue_machine.TIME_GUARDS, "lease_not_live", TimeGuard("claimed_at_us", holds_before=False))
    elif mutant == "time guard undeclared":
        monkeypatch.delitem(queue_machine.TIME_GUARDS, "lease_not_live")
    else:
        monkeypatch.setitem(queue_machine.MOVING_FIELDS, "renew_lease", ())
    record, command, now = _claimed_queue_row()
    windowed = decide_windowed(queue_machine.QUEUE, record, command, now)
    assert windowed is not None
    assert windowed != decide_ahead(queue_machine.QUEUE, record, command, now), "the mutant's window or offsets differ"
    if mutant == "window from the wrong guard":
        # What it would do: renew the lease at a time after it ran out.
        assert windowed.not_after_us > record.lease_expires_at_us


def _run_situation(mutant: str) -> tuple[Any, Any, int]:
    """A Run pair and a command where the mutant's declaration changes the window or
    the offsets: a claim of a Run that ran before (its first start is kept), or a
    timer's resume before it is due."""
    from tenure.conformance.strategies.runs import NOW, base_run, delivery_for
    from tenure.kernel.runs.commands import Claim, Resume
    from tenure.kernel.runs.record import RunPair
    from tenure.model import DeliveryState, RunStatus, WaitKind

    if mutant in ("timer guard undeclared", "window from the wrong guard"):
        run = base_run(status=RunStatus.AWAITING_TIMER, enqueue_seq=1, started_at_us=NOW - 500, node="node-a",
                       owner_kind=WaitKind.TIMER, owner_id="timer-1", wake_at_us=NOW + 1_000)
        pair = RunPair(run, (delivery_for(run, DeliveryState.SETTLED, was_claimed=True),))
        return pair, Resume(owner_id="timer-1", owner=None), NOW
    run = base_run(enqueue_seq=1, started_at_us=NOW - 500, node="node-a")
    return RunPair(run, (delivery_for(run, DeliveryState.PUBLISHED),)), Claim(enqueue_seq=1, node="node-b"), NOW


@pytest.mark.parametrize("mutant", ["timer guard undeclared", "window from the wrong guard",
                                    "updated_at always moves", "first start always moves"])
def test_a_wrong_run_declaration_is_caught_by_the_instrumented_reference(
    mutant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tenure.kernel.core import TimeGuard
    from tenure.kernel.runs import machine as run_machine

    if mutant == "timer guard undeclared":
        monkeypatch.delitem(run_machine.TIME_GUARDS, "timer_not_due")
    elif mutant == "window from the wrong guard":
        monkeypatch.setitem(run_machine.TIME_GUARDS, "timer_not_due", TimeGuard("run.updated_at_us"))
    elif mutant == "updated_at always moves":
        claim = run_machine.MOVING_FIELDS["claim"]
        monkeypatch.setitem(run_machine.MOVING_FIELDS, "claim", ("run.updated_at_us", *claim[1:]))
    else:
        claim = run_machine.MOVING_FIELDS["claim"]
        monkeypatch.setitem(run_machine.MOVING_FIELDS, "claim", (claim[0], "run.started_at_us", claim[2]))
    record, command, now = _run_situation(mutant)
    reference = decide_ahead(run_machine.RUNS, record, command, now)
    assert reference is not None
    windowed = decide_windowed(run_machine.RUNS, record, command, now)
    # A wrong window or offset, or (a time that moves backwards breaks INV-R9 at the
    # window's start) no decision where the reference makes one.
    assert windowed != reference, "the mutant's window or offsets differ"
    if mutant in ("timer guard undeclared", "window from the wrong guard"):
        # What it would do: refuse a resume that is due by then.
        assert windowed is not None and windowed.not_after_us > record.run.wake_at_us


def test_the_run_declarations_agree_with_the_reference_where_the_mutants_differ() -> None:
    # The same situations with the declarations as they are: the mutants above differ
    # from the reference, the declarations do not.
    from tenure.kernel.runs.machine import RUNS

    for mutant in ("timer guard undeclared", "updated_at always moves"):
        record, command, now = _run_situation(mutant)
        windowed = decide_windowed(RUNS, record, command, now)
        assert windowed is not None and windowed == decide_ahead(RUNS, record, command, now)


def test_a_decision_read_from_the_declarations_checks_the_invariants_at_both_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """A renewal whose lease is the last instant tenure can store at the reference time
    lies past it later in the window: the declared path refuses to decide it ahead, as
    the instrumented one does (a check at the reference time alone would pass it; the
    mutant that skips the check hands the store a record it refuses with
    ``invariant_broken``, tests/adapters/core/test_adoption.py)."""
    from tenure.kernel.queue import machine as queue_machine
    from tenure.model.bounds import MAX_INSTANT_US

    record, command, now = _claimed_queue_row()
    assert decide_windowed(queue_machine.QUEUE, record, command, now).invariants_checked  # type: ignore[union-attr]
    monkeypatch.setitem(queue_machine.EFFECTS, "renew_lease", lambda record, command, now_us: Applied(
        queue_machine.replace_fields(record, lease_expires_at_us=now_us + (MAX_INSTANT_US - now)), None))
    assert decide(queue_machine.QUEUE, record, command, now).new_record.lease_expires_at_us == MAX_INSTANT_US  # type: ignore[union-attr]
    assert decide_windowed(queue_machine.QUEUE, record, command, now) is None
    assert decide_ahead(queue_machine.QUEUE, record, command, now) is None


def test_an_invariant_that_compares_a_moving_field_with_a_fixed_one_breaks_the_declaration() -> None:
    """The mutant the test above exists to catch: an invariant ``lease at least 20 s after
    created_at`` holds at the reference time and breaks earlier in the window, so one
    check at the reference time would miss it."""
    import dataclasses

    from tenure.kernel.queue import machine as queue_machine

    def stricter(record: Any) -> list[str]:
        broken = queue_machine.record_violations(record)
        lease = record.lease_expires_at_us
        return broken + (["lease_too_early"] if lease is not None and lease < record.created_at_us + 20_000_000 else [])

    mutant = dataclasses.replace(queue_machine.QUEUE, record_violations=stricter)
    record, command, now = _claimed_queue_row()
    assert _shifting_keeps_the_invariants(queue_machine.QUEUE, record, command, now, -command.lease_us)
    assert not _shifting_keeps_the_invariants(mutant, record, command, now, -command.lease_us)
