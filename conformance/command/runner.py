"""Running the lockstep machines against one database and saying what happened.

:func:`run_machine` runs one machine (:data:`MACHINES`) on an
:class:`~tenure.conformance.lockstep.harness.ExampleDatabases` until a step budget is spent or the
database departs from the kernel. A departure (a *divergence*) is what Hypothesis shrank
it to: the command sequence, as Python, and the choice sequence that replays it
(:func:`replay_script`). :func:`conform` runs every chosen machine in a scratch area of
the user's database and checks the server facts the guarantees rest on.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from hypothesis import __version__ as HYPOTHESIS_VERSION
from hypothesis.reporting import with_reporter

from tenure.model import TenureError

from tenure.conformance.lockstep.attempts import AttemptLockstep
from tenure.conformance.lockstep.harness import COUNTERS, Counter, ExampleDatabases, LockstepBase, machine_for, rule_names, run_lockstep
from tenure.conformance.lockstep.queue import LockstepMachine
from tenure.conformance.lockstep.runs import RunLockstep

TRIPLE_DOUBLE, TRIPLE_SINGLE = chr(34) * 3, chr(39) * 3
"""A docstring's quotes, and what they become inside the replay script's docstring."""

__all__ = ["MACHINES", "MachineSpec", "MachineResult", "Divergence", "run_machine", "replay_script", "described"]


@dataclasses.dataclass(frozen=True)
class MachineSpec:
    base: type[LockstepBase]
    step_count: int
    """Steps per Hypothesis run (a run starts from an empty database)."""
    covers: str


MACHINES: dict[str, MachineSpec] = {
    "queue": MachineSpec(LockstepMachine, 50, "owned queues (pycharter's three and tasks): submissions, claims, "
                                               "fenced writes, batches, cancels, leases, lock waits"),
    "attempts": MachineSpec(AttemptLockstep, 40, "service attempts: prepare, transmit, observe, reconcile, cancel"),
    "runs": MachineSpec(RunLockstep, 150, "workflow Runs with deliveries, consents and delegated jobs"),
}
"""Every lockstep machine ``tenure conform`` runs, by the name ``--machines`` takes."""


@dataclasses.dataclass
class Divergence:
    """Where the database departed from the kernel, shrunk."""

    machine: str
    steps: list[str]
    """The shrunk command sequence, one Python statement per line."""
    error: str
    """What failed (an assertion of the harness; never driver text)."""
    blob: str | None
    """Hypothesis's encoding of the choice sequence (``reproduce_failure``), if it gave one."""
    hypothesis_version: str = HYPOTHESIS_VERSION
    replay_path: str | None = None
    rules: list[str] | None = None
    """The rules the machine ran with (None: all of them): the replay needs the same."""


@dataclasses.dataclass
class MachineResult:
    machine: str
    database: str
    steps: int
    runs: int
    rules_run: int
    rules_total: int
    races: int
    seconds: float
    divergence: Divergence | None = None
    failure: str | None = None
    """The run could not go on (the database failed or stopped answering): what failed,
    in tenure's words; not a divergence, so no replay is written."""

    def as_json(self) -> dict[str, Any]:
        answer = dataclasses.asdict(self)
        answer["divergences"] = 0 if self.divergence is None else 1
        return answer


_BLOB = re.compile(r"@reproduce_failure\('([^']+)', (b'[^']*'|b\"[^\"]*\")\)")


def _chain(error: BaseException) -> list[BaseException]:
    """``error``, the errors it holds (a group) and the ones it was raised from."""
    chain: list[BaseException] = []
    pending = [error]
    while pending and len(chain) < 50:
        current = pending.pop()
        chain.append(current)
        pending.extend(getattr(current, "exceptions", ()))
        pending.extend(link for link in (current.__cause__, current.__context__) if link is not None)
    return chain


def _is_divergence(error: BaseException) -> bool:
    """A departure from the kernel is one of the harness's assertions; anything else
    (a database failure, a connection lost) stopped the run without deciding anything."""
    return any(isinstance(current, AssertionError) for current in _chain(error))


def described(error: BaseException) -> str:
    """What failed, without driver text: the harness's assertions and tenure's errors say
    it in their own words; anything else by its type alone."""
    for current in _chain(error):
        if isinstance(current, AssertionError):
            return f"AssertionError: {str(current).splitlines()[0] if str(current) else 'assertion failed'}"[:2000]
        if isinstance(current, TenureError):
            return f"TenureError: {current.code.value}: {current.reason}"
    return type(error).__name__


def _notes(error: BaseException) -> list[str]:
    """Every note on ``error`` and on the errors it holds (Hypothesis attaches the
    falsifying command sequence and its reproduction line as notes)."""
    notes: list[str] = []
    pending = [error]
    while pending and len(notes) < 10_000:
        current = pending.pop()
        notes.extend(str(note) for note in getattr(current, "__notes__", ()))
        pending.extend(getattr(current, "exceptions", ()))
    return notes


_STEP = re.compile(r"^(state = |state\.|\w+(, \w+)* = state\.)")


def _steps(text: str) -> list[str]:
    """The last command sequence ``text`` reports (the shrunk one), one statement a line."""
    steps = [line.strip() for line in text.splitlines() if _STEP.match(line.strip())]
    starts = [index for index, line in enumerate(steps) if line.startswith("state = ")]
    return steps[starts[-1]:] if starts else steps


def _own_notes(error: BaseException) -> str | None:
    """The notes of the first assertion in ``error`` that carry a command sequence."""
    for current in _chain(error):
        if isinstance(current, AssertionError):
            text = "\n".join(map(str, getattr(current, "__notes__", ())))
            if _steps(text):
                return text
    return None


def _divergence(machine: str, lines: list[object], error: BaseException) -> Divergence:
    # Hypothesis may report more than one distinct failure at once (a group: on a loaded
    # machine a second one, a database call out of time say, can come with the
    # divergence). The sequence and the blob shown are then the divergence's own: the
    # notes of the assertion that failed, when they hold a sequence; otherwise everything
    # reported, whose last sequence is the shrunk one.
    everything = "\n".join([*map(str, lines), *_notes(error)])
    text = _own_notes(error) or everything
    found = _BLOB.search(text) or _BLOB.search(everything)
    return Divergence(machine, _steps(text), described(error), found.group(2) if found else None,
                      found.group(1) if found else HYPOTHESIS_VERSION)


def run_machine(name: str, databases: ExampleDatabases, steps: int, *, seed: int | None = None,
                on_step: Callable[[Counter], None] | None = None, label: str | None = None,
                only: frozenset[str] | None = None, shrink: bool = True) -> MachineResult:
    """Run machine ``name`` for ``steps`` steps on ``databases`` (see the module's
    docstring); with ``only``, just those of its rules; ``shrink=False`` reports a
    divergence as found, unshrunk."""
    spec = MACHINES[name]
    machine = machine_for(spec.base, databases, only=only)
    lines: list[object] = []
    started = time.perf_counter()
    divergence = None
    failure = None
    try:
        with with_reporter(lines.append):
            run_lockstep(machine, steps, step_count=spec.step_count, seed=seed, on_step=on_step, print_blob=True,
                         shrink=shrink)
    except Exception as error:  # noqa: BLE001 - any departure is reported, with what Hypothesis shrank it to
        if _is_divergence(error):
            divergence = _divergence(name, lines, error)
            divergence.rules = None if only is None else sorted(only)
        else:
            failure = _failure(error)
    counter = COUNTERS.get(machine.key(), Counter())
    return MachineResult(
        machine=name, database=label or databases.kind, steps=counter.steps, runs=counter.examples,
        rules_run=len(counter.rules), rules_total=len(rule_names(machine)), races=counter.races,
        seconds=round(time.perf_counter() - started, 1), divergence=divergence, failure=failure,
    )


def _failure(error: BaseException) -> str:
    for current in _chain(error):
        if isinstance(current, TenureError):
            return f"{current.code.value}: {current.reason}"
    return f"{type(error).__name__} (no answer from the database)"


def replay_script(divergence: Divergence, *, database_kind: str, pooler: str | None) -> str:
    """A Python script that replays ``divergence`` in a new scratch area of the database
    its ``--db`` (or ``TENURE_DB``) names: exit 1 if the database departs again, 0 if not,
    2 if it cannot run (another Hypothesis version, a refused database)."""
    steps = "\n".join("    " + line for line in divergence.steps).replace(TRIPLE_DOUBLE, TRIPLE_SINGLE)
    error = divergence.error.replace(TRIPLE_DOUBLE, TRIPLE_SINGLE)
    title = f"the {divergence.machine} machine on {database_kind}" + ("" if pooler is None else f" (pooler={pooler})")
    return f'''#!/usr/bin/env python3
r"""Replays a divergence ``tenure conform`` found: {title}.

    python {{this file}} --db URL        (or TENURE_DB=URL python {{this file}})

It makes a new scratch area in that database (as ``tenure conform`` does), replays the
shrunk command sequence below through Hypothesis's recorded choices, and exits 1 if the
database departs from the kernel again, 0 if it does not, 2 if it cannot run. It needs
tenure[conform] with hypothesis=={divergence.hypothesis_version}.

What failed: {error}

The shrunk command sequence (for reading; the replay uses the recorded choices):
{steps}
"""
import sys

from tenure.conformance.command.replay import main

MACHINE = {divergence.machine!r}
HYPOTHESIS_VERSION = {divergence.hypothesis_version!r}
CHOICES = {divergence.blob}
RULES = {divergence.rules!r}

if __name__ == "__main__":
    sys.exit(main(MACHINE, HYPOTHESIS_VERSION, CHOICES, sys.argv[1:], rules=RULES))
'''


def machine_names(given: Sequence[str] | None) -> list[str]:
    return list(MACHINES) if not given else list(dict.fromkeys(given))
