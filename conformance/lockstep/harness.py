"""The lockstep harness every machine shares: one Hypothesis ``RuleBasedStateMachine`` per
(machine, database), each run on a fresh migrated database (handed out by an
:class:`ExampleDatabases`: tenure's own test servers, or the scratch area ``tenure
conform`` makes in a user's database) through its own ``asyncio.Runner``; the database time each transaction read is observed and handed to
the kernel-backed model, so the model decides with exactly the clock the database used;
after every step the replies and every stored row must equal the model's. A machine's
lockstep subclasses :class:`LockstepBase` with its rules and its model; the budget loop,
the counters and the focused machines for mutant tests are here, once.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import math
import os
import pathlib
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Protocol

from hypothesis import HealthCheck, Phase, seed as seeded, settings
from hypothesis.stateful import (
    INVARIANT_MARKER, RULE_MARKER, Invariant, Rule, RuleBasedStateMachine, run_state_machine_as_test,
)

from tenure.model import TenureError

__all__ = [
    "outcome", "applied_counts", "path_counts", "Clock", "Counter", "COUNTERS", "ExampleDatabases", "LockstepBase", "machine_for", "rule_names",
    "run_lockstep", "budget", "RacingModel",
]


class ExampleDatabases(Protocol):
    """Where each lockstep run's fresh database comes from."""

    kind: str
    """``sqlite`` or ``postgresql``."""

    def acquire(self, workdir: pathlib.Path) -> str:
        """A URL of a database holding exactly what ``upgrade`` creates (``workdir`` is the
        run's own temporary folder)."""

    def release(self, db_url: str, *, reuse: bool) -> None:
        """The end of a run's database; ``reuse``: the run closed everything it opened."""


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    """("ok", value) or ("error", code value, reason)."""
    try:
        return ("ok", call())
    except TenureError as error:
        return ("error", error.code.value, error.reason)


class Clock:
    """Collects the database times the stores sampled during one operation."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def take(self) -> int:
        assert len(self.seen) == 1, f"one transaction per operation, saw {len(self.seen)}"
        now = self.seen[0]
        self.seen.clear()
        return now

    def take_all(self) -> list[int]:
        seen = list(self.seen)
        self.seen.clear()  # in place: the stores hold this list's append
        return seen


@dataclasses.dataclass
class Counter:
    steps: int = 0
    examples: int = 0
    races: int = 0
    """Steps that ran two calls at once (:meth:`LockstepBase.race`)."""
    rules: dict[str, int] = dataclasses.field(default_factory=dict)
    """How often each rule ran."""
    applied: dict[str, int] = dataclasses.field(default_factory=dict)
    """By rule: the steps whose expected answer applied something (the model answered
    with a value other than None or False); see :func:`applied_counts`."""
    refused: dict[str, int] = dataclasses.field(default_factory=dict)
    """By rule: the steps the model refused (None, False, or a coded error)."""
    rule: str | None = None
    """The rule running now (set by a counted machine's rules)."""
    on_step: Callable[[Counter], None] | None = None
    """Called after every step (a progress display)."""
    paths: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    """By command kind: how often each engine path decided it (a machine whose engine
    decides some commands ahead counts them: ``ahead`` and ``fallback``); see
    :func:`path_counts`."""
    findings: list[str] = dataclasses.field(default_factory=list)
    """What each failed rule or invariant raised (its type and message), as it was raised:
    a mutant test reads the finding here, because the draws read database times and
    Hypothesis's replay of a failing run may then draw differently and report only that
    the run was flaky."""

    def step(self) -> None:
        self.steps += 1
        if self.on_step is not None:
            self.on_step(self)

    def took(self, kind: str, path: str) -> None:
        """Count one command of ``kind`` decided by ``path``."""
        by_path = self.paths.setdefault(kind, {})
        by_path[path] = by_path.get(path, 0) + 1

    def answered(self, *expected: tuple[Any, ...]) -> None:
        """Count the model's answers of the running rule's step: applied when any of
        them applied something (a race applies when one of its calls did)."""
        if self.rule is None:
            return
        tally = self.applied if any(_applies(answer) for answer in expected) else self.refused
        tally[self.rule] = tally.get(self.rule, 0) + 1


def _applies(answer: tuple[Any, ...]) -> bool:
    return answer[0] == "ok" and answer[1] is not None and answer[1] is not False


def applied_counts(counter: Counter) -> str:
    """One line per rule: how often it ran, applied and was refused (a rule that rarely
    applies leaves the paths behind it unchecked)."""
    lines = []
    for name in sorted(counter.rules):
        applied, refused = counter.applied.get(name, 0), counter.refused.get(name, 0)
        lines.append(f"{name}: ran {counter.rules[name]}, applied {applied}, refused {refused}")
    return "\n".join(lines)


def path_counts(counter: Counter) -> str:
    """One line per command kind: how often each engine path decided it (empty when the
    machine counts none: a store without decided-ahead statements)."""
    return "\n".join(f"{kind}: " + ", ".join(f"{path} {count}" for path, count in sorted(by_path.items()))
                     for kind, by_path in sorted(counter.paths.items()))


COUNTERS: dict[str, Counter] = {}
"""Steps and runs by ``<machine>:<database>``."""


class LoopRunner:
    """``asyncio.Runner``'s loop and shared context without its per-call SIGINT handler
    swap: ``Runner.run`` installs and removes a handler on every call, and ``signal``
    turns each handler back into an enum by formatting the repr of the handler (a
    partial holding the running task), which cost a tenth of a SQLite lockstep run's
    CPU. A Ctrl-C still interrupts the run (as a KeyboardInterrupt inside the loop)."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()
        self._context = contextvars.copy_context()

    def run(self, coroutine: Any) -> Any:
        loop = self._runner.get_loop()
        return loop.run_until_complete(loop.create_task(coroutine, context=self._context))

    def close(self) -> None:
        self._runner.close()


class RacingModel(Protocol):
    """What :meth:`LockstepBase.race` asks of a machine's model: its records as a value,
    and back."""

    def snapshot(self) -> Any: ...

    def restore(self, saved: Any) -> None: ...


class LockstepBase(RuleBasedStateMachine):
    """Subclassed per machine (``machine_name``) and database (``database``)."""

    model: Any
    """The machine's model (each subclass sets it and declares its type); a racing
    machine's is a :class:`RacingModel`."""

    machine_name = "machine"
    database = "sqlite"
    """The kind of :attr:`databases` (set by :func:`machine_for`)."""
    databases: ClassVar[ExampleDatabases]

    def __init__(self) -> None:
        super().__init__()
        self.runner = LoopRunner()
        self.workdir = tempfile.TemporaryDirectory()
        self.counter = COUNTERS.setdefault(self.key(), Counter())
        self.counter.examples += 1
        self.db_url = self.databases.acquire(pathlib.Path(self.workdir.name))
        self.clock = Clock()
        self.step_dump: Any = None
        """Every stored row, as a racing rule read them at the end of its step (see
        :meth:`rows_after_step`); cleared when anything runs against the database."""

    @classmethod
    def key(cls) -> str:
        return f"{cls.machine_name}:{cls.database}"

    def close_resources(self) -> None:
        """Close what a subclass opened (its sources or ledgers), on the runner."""

    def teardown(self) -> None:
        try:
            closed = False
            try:
                self.close_resources()
                closed = True
            finally:
                self.databases.release(self.db_url, reuse=closed)
        finally:
            self.runner.close()
            self.workdir.cleanup()

    def run(self, coroutine: Any) -> tuple[Any, ...]:
        async def call() -> Any:
            return await coroutine

        self.clock.seen.clear()
        self.step_dump = None
        return outcome(lambda: self.runner.run(call()))

    def dump(self) -> Any:
        """Every stored row (machines whose racing rules compare them define it)."""
        raise NotImplementedError

    def rows_after_step(self) -> Any:
        """The stored rows for the after-every-step invariant: the ones a racing rule
        already read as its step's last database call (nothing ran since, so a second
        read would return the same), else a fresh :meth:`dump`."""
        dumped, self.step_dump = self.step_dump, None
        return self.dump() if dumped is None else dumped

    def expect(self, actual: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
        self.counter.step()
        self.counter.answered(expected)
        assert actual == expected, f"adapter {actual!r} != model {expected!r}"

    # --- two calls at once ----------------------------------------------------------------
    #
    # A racing rule runs two calls concurrently and asks whether one serial order of the
    # two kernel decisions explains what the database did. Every model takes part through
    # one protocol: ``self.model.snapshot()`` / ``self.model.restore(saved)`` (its records
    # as a value, and back) and :meth:`model_rows` (its records as :meth:`dump` reads the
    # database's).

    def model_rows(self) -> Any:
        """The model's records, comparable with :meth:`dump`."""
        raise NotImplementedError

    def model_outcome(self, call: Callable[[], Any]) -> tuple[Any, ...]:
        """A model step's answer as :meth:`run` reports the adapter's."""
        return outcome(call)

    def race(self, calls: Sequence[Callable[[], Any]], model_steps: Sequence[Callable[[int], Any]],
             normalize: Callable[[tuple[Any, ...]], tuple[Any, ...]] = lambda answer: answer) -> None:
        """Run two adapter calls at once; the database must have done what one serial
        order of the two kernel decisions does, at the times its transactions read. (The
        serial order of two calls on one row follows their database times: the later
        call's clock was read after the earlier one's lock ended; their times are
        reported as each call's decision is made, which for one-statement writes need
        not be in clock order, hence sorted.)"""
        async def both() -> list[tuple[Any, ...]]:
            async def one(call: Callable[[], Any]) -> tuple[Any, ...]:
                try:
                    return ("ok", await call())
                except TenureError as error:
                    return ("error", error.code.value, error.reason)

            return list(await asyncio.gather(*(one(call) for call in calls)))

        self.clock.seen.clear()
        actual = [normalize(answer) for answer in self.runner.run(both())]
        times = sorted(self.clock.take_all())
        assert len(times) == 2, f"one transaction per call, saw {len(times)}"
        stored = self.dump()
        model: RacingModel = self.model
        before = model.snapshot()
        for order in ((0, 1), (1, 0)):
            model.restore(before)
            expected: list[tuple[Any, ...]] = [(), ()]
            for position, index in enumerate(order):
                expected[index] = normalize(self.model_outcome(functools.partial(model_steps[index], times[position])))
            if expected == actual and self.model_rows() == stored:
                self.counter.answered(*expected)
                self.counter.races += 1
                self.counter.step()
                self.step_dump = stored  # the invariant compares every row with the model next
                return
        raise AssertionError(f"no serial order explains {actual!r}")


def _recorded(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` again, keeping what it raises in the machine's
    :attr:`Counter.findings`; the function keeps its name, so a printed counterexample
    names the rule as written."""

    def recorded(self: LockstepBase, **arguments: Any) -> Any:
        try:
            return function(self, **arguments)
        except AssertionError as finding:
            self.counter.findings.append(f"{type(finding).__name__}: {finding}")
            raise

    recorded.__name__ = recorded.__qualname__ = function.__name__
    return recorded


def _counted(name: str, rule: Rule) -> Any:
    """``rule`` again, counting each run in the machine's :class:`Counter` and keeping
    its findings (:func:`_recorded`)."""
    function = _recorded(rule.function)

    def counted(self: LockstepBase, **arguments: Any) -> Any:
        self.counter.rules[name] = self.counter.rules.get(name, 0) + 1
        self.counter.rule = name
        try:
            return function(self, **arguments)
        finally:
            self.counter.rule = None

    counted.__name__ = counted.__qualname__ = rule.function.__name__
    setattr(counted, RULE_MARKER, Rule(targets=rule.targets, function=counted, arguments=rule.arguments,
                                       preconditions=rule.preconditions))
    return counted


def _kept(check: Invariant) -> Any:
    """An invariant again, keeping its findings (:func:`_recorded`)."""
    function = _recorded(check.function)
    setattr(function, INVARIANT_MARKER, Invariant(function=function, preconditions=check.preconditions,
                                                  check_during_init=check.check_during_init))
    return function


def rule_names(machine: type[LockstepBase]) -> list[str]:
    """The rules of ``machine``, by name."""
    return sorted(name for name in dir(machine) if hasattr(getattr(machine, name), RULE_MARKER))


def machine_for(base: type[LockstepBase], databases: ExampleDatabases, *,
                only: frozenset[str] | None = None) -> type[LockstepBase]:
    """The lockstep machine of ``base`` on ``databases``; with ``only``, every other rule
    is left out (a focused machine that reaches one situation sooner, for mutant tests)."""
    attributes: dict[str, Any] = {"database": databases.kind, "databases": databases}
    for name in dir(base):
        member = getattr(base, name)
        check = getattr(member, INVARIANT_MARKER, None)
        if check is not None:
            attributes[name] = _kept(check)
        rule = getattr(member, RULE_MARKER, None)
        if rule is None:
            continue
        if only is not None and name not in only:
            attributes[name] = lambda self, **arguments: None  # undecorated: no longer a rule
        else:
            attributes[name] = _counted(name, rule)
    return type(f"Lockstep_{base.machine_name}_{databases.kind}", (base,), attributes)


def budget(defaults: dict[str, int]) -> dict[str, int]:
    """Steps CI runs per database (the test fails if fewer ran). ``TENURE_LOCKSTEP_STEPS=N``
    sets every database's budget instead: smaller for a quick check, larger for a soak."""
    if os.environ.get("TENURE_LOCKSTEP_STEPS"):
        return dict.fromkeys(defaults, int(os.environ["TENURE_LOCKSTEP_STEPS"]))
    return dict(defaults)


def run_lockstep(machine: type[LockstepBase], target: int, *, step_count: int = 50, seed: int | None = None,
                 on_step: Callable[[Counter], None] | None = None, print_blob: bool = False,
                 shrink: bool = True, every_rule_by: int | None = None,
                 covered: Callable[[Counter], bool] | None = None) -> str:
    """Run ``machine`` until ``target`` steps ran; returns the summary line (the counts
    are in ``COUNTERS[machine.key()]``). With ``seed``, the runs are the same each time
    (for the same Hypothesis version); a divergence raises what the machine raised,
    shrunk by Hypothesis unless ``shrink`` is false (then as found: sooner, longer).

    With ``every_rule_by``, a rule that has not run yet at ``target`` keeps the runs
    going until it has, or until ``every_rule_by`` steps ran (the caller then checks that
    every rule ran). The rules a run chooses depend on the database's answers (times,
    races), so a fixed budget that covers every rule on a quiet machine can miss one on
    a loaded machine; a budget this way is a floor, not a gamble. ``covered`` (with
    ``every_rule_by``) keeps the runs going the same way until it says the counts cover
    what the caller checks next (the engine paths every command kind must take)."""
    phases = tuple(phase for phase in Phase if shrink or phase is not Phase.shrink)
    key = machine.key()
    COUNTERS[key] = Counter(on_step=on_step)
    wanted = frozenset(rule_names(machine))

    def more(counter: Counter) -> bool:
        if counter.steps < target:
            return True
        return every_rule_by is not None and counter.steps < every_rule_by and (
            not wanted <= set(counter.rules) or (covered is not None and not covered(counter)))

    started = time.perf_counter()
    batch = 0
    while more(COUNTERS[key]):
        counter = COUNTERS[key]
        # Before the first run, guess that runs use most of their step count.
        average = counter.steps / counter.examples if counter.examples else step_count * 0.7
        examples = max(10, math.ceil((target - counter.steps) / max(average, 1)))
        if seed is not None:
            # Each batch its own seed: the same seed again would replay the same runs.
            # Hypothesis's @seed, applied to the machine class as its documentation shows.
            seeded(seed + batch)(machine)
        elif batch and getattr(settings.default, "derandomize", False):
            # A derandomized profile (CI's) derives every call's seed from the machine, so
            # a second batch would replay the first one's runs: each later batch gets a
            # seed of its own, the same in every derandomized run.
            seeded(batch)(machine)
        batch += 1
        run_state_machine_as_test(
            machine,
            settings=settings(
                max_examples=examples, stateful_step_count=step_count, deadline=None,
                suppress_health_check=list(HealthCheck), database=None, print_blob=print_blob, phases=phases,
            ),
        )
    elapsed = time.perf_counter() - started
    counter = COUNTERS[key]
    assert counter.steps >= target
    paths = path_counts(counter)
    return (f"lockstep[{key}]: {counter.steps} steps in {counter.examples} runs, "
            f"{elapsed:.1f} s, {counter.steps / elapsed:.0f} steps/s" + (f"\nengine paths by command:\n{paths}" if paths else ""))
