"""Compiled deciders (tenure.kernel.compiled): each function generated for a (machine,
command) returns exactly what the generic ``decide_windowed`` returns (decision, reply,
new record, refusal reason, window, offsets, whether the invariants were checked, or
None), the checked-in rendering is the source tenure builds, and a generator broken in
any of the ways a plausible bug would look is caught by the equality property."""

from __future__ import annotations

import dataclasses
import enum
import runpy
from typing import Any

import compiled_renderings
import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from tenure.conformance.strategies import queues
from tenure.kernel import compiled
from tenure.kernel.ahead import DEFAULT_SPAN_US, decide_windowed
from tenure.kernel.core import Declarations, Machine, Rule, TimeGuard
from tenure.kernel.queue.commands import ClaimFence
from tenure.kernel.queue.commands import QueueCommandType as C
from tenure.kernel.queue.machine import COMPILED_COMMANDS, QUEUE, deciders, QueueRefusal
from tenure.kernel.queue.record import QueueStep

ODD_VALUES = (None, True, False, 0, -1, 5, 10**20, -(10**20), 1.5, "", "x", ())
"""Values of the wrong type or out of bounds: a command field set to one makes the
effect raise, or write a record that breaks an invariant (which the reference refuses
to decide ahead), or pass unnoticed: the compiled function must do the same."""


def _instants(record: Any) -> list[int]:
    return sorted({value for field, value in ((name, getattr(record, name)) for name in record.__dataclass_fields__)
                   if field.endswith("_us") and type(value) is int})


@st.composite
def situations(draw: st.DrawFn, kind: enum.Enum) -> tuple[Any, Any, int, int]:
    """A (record, command, now, span) of ``kind``: the queue's own strategy, the time
    often right at one of the record's instants (where a time guard flips), the span
    sometimes narrow (so a guard's instant lies outside it), and a quarter of the
    commands with one field set to an odd value (:data:`ODD_VALUES`)."""
    state = draw(st.sampled_from([None, QueueStep.CLAIMED, QueueStep.CLAIMED, QueueStep.PENDING]))  # the states the hot commands apply in
    record, command, now = draw(queues.situations(state=state, kind=kind))
    live = record is not None and record.claim_token is not None and record.lease_expires_at_us is not None
    if live and hasattr(command, "fence") and draw(st.integers(0, 2)) > 0:
        # The claim's own exact fence, the lease still live: the rules past the fence.
        command = dataclasses.replace(command, fence=ClaimFence(
            queue=record.queue, job_id=record.job_id, owner_id=record.owner_id, generation=record.generation,
            claim_token=record.claim_token))
        now = record.lease_expires_at_us - draw(st.sampled_from([1, 2, 1_000, 10**9]))
    elif record is not None and draw(st.booleans()):
        edge = draw(st.sampled_from(_instants(record)))
        now = draw(st.sampled_from([edge - 1, edge, edge + 1]))
    span = draw(st.sampled_from([DEFAULT_SPAN_US, DEFAULT_SPAN_US, 1, 2, 1_000]))
    if draw(st.integers(0, 3)) == 0:
        field = draw(st.sampled_from([field.name for field in dataclasses.fields(command)]))
        command = dataclasses.replace(command, **{field: draw(st.sampled_from(ODD_VALUES))})
    return record, command, now, span


def _outcome(decider: Any, record: Any, command: Any, now: int, span: int) -> tuple[str, Any]:
    """What ``decider`` returns, or the type of what it raises (the reference raises on
    some odd commands: the compiled function must raise the same)."""
    try:
        return "returned", decider(record, command, now, span_us=span)
    except Exception as error:  # noqa: BLE001 - compared, never swallowed
        return "raised", type(error)


def _reference(record: Any, command: Any, now: int, span_us: int) -> Any:
    return decide_windowed(QUEUE, record, command, now, span_us=span_us)


def _differs(decider: Any, situation: tuple[Any, Any, int, int]) -> bool:
    return _outcome(decider, *situation) != _outcome(_reference, *situation)


@pytest.mark.parametrize("kind", COMPILED_COMMANDS, ids=lambda kind: kind.value)
@settings(max_examples=1_000, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_compiled_decider_returns_exactly_what_decide_windowed_returns(kind: enum.Enum, data: st.DataObject) -> None:
    situation = data.draw(situations(kind))
    assert _outcome(deciders()[kind], *situation) == _outcome(_reference, *situation)


UNREACHABLE = {("attempts_exhausted", QueueRefusal.NOT_ELIGIBLE)}
"""Rules no valid record meets: a pending record has attempts left (INV-Q4)."""


@pytest.mark.parametrize("kind", COMPILED_COMMANDS, ids=lambda kind: kind.value)
def test_the_equality_property_meets_every_rule_of_the_compiled_command(kind: enum.Enum) -> None:
    """The property is not vacuous: its situations reach every rule of the command's
    lists, applied and refused (but the one no valid record meets), and some applied
    decisions are held to the invariants."""
    wanted = {(rule.guard, rule.outcome) for state in QUEUE.states for rule in QUEUE.table[(state, kind)]}
    met: set[tuple[str, Any]] = set()
    checked = False

    @settings(max_examples=1_500, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(situation=situations(kind))
    def meet(situation: tuple[Any, Any, int, int]) -> None:
        nonlocal checked
        record, command, now, span = situation
        try:
            windowed = _reference(record, command, now, span)
            rule = QUEUE.select_rule(record, command, now)
        except Exception:  # noqa: BLE001 - an odd command: counted by the property above
            return
        met.add((rule.guard, rule.outcome))
        checked |= windowed is not None and windowed.invariants_checked

    meet()
    assert met == wanted - UNREACHABLE
    assert checked, "some decisions apply with their record held to the invariants"


def test_the_queue_compiles_its_hot_fenced_commands_and_the_claim() -> None:
    assert set(deciders()) == set(COMPILED_COMMANDS) >= {C.HEARTBEAT_OWNED, C.COMPLETE_OWNED, C.FAIL_OWNED,
                                                       C.RELEASE_OWNED, C.CLAIM_OWNED}


def test_the_compiled_source_calls_the_kernels_guards_and_effects_and_writes_the_time_guards_out() -> None:
    """The generated code is the kernel's rules: every non-time guard and the effect are
    the machine's own functions, bound by name; the time guard is its declaration."""
    source = compiled.source_of(QUEUE, C.COMPLETE_OWNED)
    bound = {binding.name: binding.value for binding in source.bindings}
    assert bound["guard_fence_mismatch"] is QUEUE.guards["fence_mismatch"]
    assert bound["guard_cancel_requested"] is QUEUE.guards["cancel_requested"]
    assert bound["effect_complete"] is QUEUE.effects["complete"]
    assert bound["record_violations"] is QUEUE.record_violations
    assert "guard_lease_not_live" not in bound and "instant = record.lease_expires_at_us" in source.source


def test_a_declaration_patched_after_the_deciders_were_generated_reaches_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken kernel patched in at any time (a guard, a rule list) is what the compiled
    deciders decide by from their next call on, never the sound kernel they were generated
    from; restoring it brings the sound ones back."""
    sound = compiled.decider_of(QUEUE, C.COMPLETE_OWNED)
    assert sound is not None and compiled.decider_of(QUEUE, C.COMPLETE_OWNED) is sound  # kept while unchanged
    with monkeypatch.context() as patch:
        patch.setitem(QUEUE.guards, "fence_mismatch", lambda record, command, now_us: False)
        broken = compiled.decider_of(QUEUE, C.COMPLETE_OWNED)
        assert broken is not sound and broken is not None
        bound = {binding.name: binding.value for binding in compiled.source_of(QUEUE, C.COMPLETE_OWNED).bindings}
        assert bound["guard_fence_mismatch"] is QUEUE.guards["fence_mismatch"]
        claimed = next(iter(QUEUE.table))  # any rule list: a table patch counts too
        patch.setitem(QUEUE.table, claimed, QUEUE.table[claimed])
        assert compiled.decider_of(QUEUE, C.COMPLETE_OWNED) is not broken
    restored = compiled.decider_of(QUEUE, C.COMPLETE_OWNED)
    assert restored is not None and restored is not broken
    assert compiled.source_of(QUEUE, C.COMPLETE_OWNED).source == compiled.source_of(QUEUE, C.COMPLETE_OWNED).source


def test_a_machine_that_compiles_needs_its_declarations_in_declarations_mappings() -> None:
    with pytest.raises(ValueError, match="Declarations"):
        Machine.define(
            name="queue", states=QUEUE.states, commands=QUEUE.commands, rows=QUEUE.rows, guards=dict(QUEUE.guards),
            effects=QUEUE.effects, outcomes=QUEUE.outcomes, state_of=QUEUE.state_of,
            record_violations=QUEUE.record_violations, transition_violations=QUEUE.transition_violations,
            initial=QUEUE.initial, rewrites=QUEUE.rewrites, time_guards=QUEUE.time_guards,
            moving_fields=QUEUE.moving_fields, invariants_see_moving_fields_by_bounds=True, compiled=COMPILED_COMMANDS)
    assert isinstance(QUEUE.table, Declarations)


# --- the rendering ---------------------------------------------------------------------


def test_the_checked_in_rendering_is_current() -> None:
    assert compiled_renderings.stale() == [], f"re-render: {compiled_renderings.RERENDER}"


def test_a_changed_rule_makes_the_rendering_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "_rules_of", _dropping("cancel_requested"))
    assert compiled_renderings.stale() == ["queue.py"]


def test_the_rendering_binds_what_tenure_binds_and_defines_the_same_functions() -> None:
    """The rendered file, run, binds every name to the object the generator bound and
    defines each decider with the bytecode of the one tenure builds."""
    rendered = runpy.run_path(str(compiled_renderings.COMPILED_DIR / "queue.py"))
    for kind in COMPILED_COMMANDS:
        source = compiled.source_of(QUEUE, kind)
        for binding in source.bindings:
            assert rendered[binding.name] == binding.value, binding.name
        function = rendered[compiled.function_name(kind)]
        assert function.__code__.co_code == deciders()[kind].__code__.co_code, kind


# --- broken generators: the equality property catches each ---------------------------


def _dropping(guard: str) -> Any:
    original = compiled._rules_of

    def rules_of(machine: Any, state: Any, kind: Any) -> tuple[Rule, ...]:
        return tuple(rule for rule in original(machine, state, kind) if rule.guard != guard)

    return rules_of


def _swapping(first: str, second: str) -> Any:
    original = compiled._rules_of

    def rules_of(machine: Any, state: Any, kind: Any) -> tuple[Rule, ...]:
        rules = list(original(machine, state, kind))
        at = {rule.guard: index for index, rule in enumerate(rules)}
        if first in at and second in at:
            rules[at[first]], rules[at[second]] = rules[at[second]], rules[at[first]]
        return tuple(rules)

    return rules_of


def _window_from(field: str) -> Any:
    """The time guard's window (and test) read from another instant of the record."""
    original = compiled._time_guard_of

    def time_guard_of(machine: Any, guard: str) -> Any:
        declared = original(machine, guard)
        return None if declared is None else TimeGuard(field, declared.holds_before)

    return time_guard_of


def _window_only_from(field: str) -> Any:
    """The window narrowed at another instant of the record, the guard's test kept."""
    original = compiled._time_guard_lines

    def time_guard_lines(declared: Any, held: str) -> list[str]:
        lines = original(declared, held)
        read = lines[0]
        assert read.startswith("instant = ")
        return [f"instant = record.{field}", *lines[1:-1], read, lines[-1]]

    return time_guard_lines


def _time_guard_inverted() -> Any:
    original = compiled._time_guard_of

    def time_guard_of(machine: Any, guard: str) -> Any:
        declared = original(machine, guard)
        return None if declared is None else TimeGuard(declared.field, not declared.holds_before)

    return time_guard_of


GENERATOR_MUTANTS: dict[str, tuple[str, Any, enum.Enum]] = {
    "a guard dropped (complete of a cancel-requested stream)":
        ("_rules_of", lambda: _dropping("cancel_requested"), C.COMPLETE_OWNED),
    "a guard dropped (release of a stream with a PID)": ("_rules_of", lambda: _dropping("pid_recorded"), C.RELEASE_OWNED),
    "two guards swapped (the lease checked before the fence)":
        ("_rules_of", lambda: _swapping("fence_mismatch", "lease_not_live"), C.HEARTBEAT_OWNED),
    "two guards swapped (retry before the cancel request)":
        ("_rules_of", lambda: _swapping("cancel_requested", "retry_allowed"), C.FAIL_OWNED),
    "two guards swapped (due before the queue)": ("_rules_of", lambda: _swapping("other_queue", "not_due"), C.CLAIM_OWNED),
    "the window from the wrong guard's instant (heartbeat)":
        ("_time_guard_lines", lambda: _window_only_from("fires_at_us"), C.HEARTBEAT_OWNED),
    "the window from the wrong guard's instant (claim)":
        ("_time_guard_lines", lambda: _window_only_from("created_at_us"), C.CLAIM_OWNED),
    "a time guard and its window read from the wrong instant":
        ("_time_guard_of", lambda: _window_from("fires_at_us"), C.HEARTBEAT_OWNED),
    "a time guard inverted": ("_time_guard_of", _time_guard_inverted, C.RELEASE_OWNED),
    "the invariant check left out": ("_checks_invariants", lambda: lambda machine: False, C.COMPLETE_OWNED),
    "the changed-field check taken as proof without running it":
        ("_unshown_by_changed_fields", lambda: lambda machine: "record is None", C.COMPLETE_OWNED),
}


@pytest.mark.parametrize("mutant", sorted(GENERATOR_MUTANTS))
def test_a_broken_generator_is_caught_by_the_equality_property(mutant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    target, breaking, kind = GENERATOR_MUTANTS[mutant]
    sound = deciders()[kind]  # generated (once, cached) before the generator is broken
    monkeypatch.setattr(compiled, target, breaking())
    broken = compiled.compile_decider(QUEUE, kind)
    assert broken.__code__.co_code != sound.__code__.co_code, "the mutant changes the generated code"
    try:
        find(situations(kind), lambda situation: _differs(broken, situation),
             settings=settings(max_examples=2_000, database=None, phases=[Phase.generate], suppress_health_check=[HealthCheck.too_slow]))
    except NoSuchExample:
        pytest.fail(f"the equality property missed the broken generator: {mutant}")
