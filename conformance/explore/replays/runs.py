"""An explorer trace of workflow Runs, replayed against a real database.

The Run explorer (:mod:`tenure.conformance.explore.runs`) finds a shortest trace in a world of
kernel records: Runs with their current delivery, consents, delegated jobs and node
leases. :func:`replay_run_trace` sends the same trace to a Run ledger on a database (a
scratch area, as ``tenure conform`` makes), step by step. Each kernel decision of a step
(``RunWorld.last``: a ``Decided`` on the machine ``runs``, ``consent``, ``agent_jobs`` or
``nodes``) goes, in order, as the same kernel command to the same record through the
engine path the adapters use for it:

- ``runs``: ``RunLedger.engine.send(run_id, command)``, the Run engine's one entry (lock
  the Run and its current delivery, read the evidence the kernel's aggregate declares
  from the replay's database and complete the command with it, read the clock, decide,
  compare-and-set, run the declared follow-ups: a decision that sweeps the Run's pending
  consents sweeps them in the same transaction);
- ``consent``: a creation through the consents facade's transaction (the Run locked
  first, whether it may ask read from the database), a verdict through the engine on the
  consent's row (``Consents.decide``'s path); a sweep (actor ``ledger (sweep)``) is not
  sent: the Run's decision made it, and the replay compares what it did to the consent;
- ``agent_jobs``: a submission through the delegated jobs facade's transaction, a result
  or a containment through the engine on the job's row (``AgentJobs._command``'s path);
- ``nodes``: ``NodeLeases.send`` (the node row locked, the kernel decides; the adapters' test seam).

Commands go as the world made them, with the evidence the explorer gathered (an owner's
status, a containment count, what the broker said): in lockstep the database holds what
the world holds up to the first departure, so the same evidence is what the adapters
would have read. The one absolute instant a command carries (a timer park's
``wake_at_us``) is moved onto the database's clock as the attempt replay does (world
instant ``w`` at world time ``W`` becomes ``now + (w - W)``, ``now`` read just before it
is sent). The database's answer (applied, or refused with the kernel's reason, raised
or answered) is compared with the trace's decision.

The world's initial state is not empty: its node leases were booted and (in most
worlds) its Runs admitted, or admitted and claimed, before the first step. Those
decisions are recorded when the script is written (:func:`prelude`: the world's own
initial construction, watched) and replayed first, as step 0.

Not sent, because they are not stored rows of these machines: the broker's jobs (the
broker is the world's; the commands carry what it said), the workers' and processes'
knowledge, the checkpoints (the world's checkpoint rows are evidence its recovery reads;
recovery's verdicts are decided in the world, and only the machine decisions they lead
to are sent), and the ghost history.

A step of the world's clock (and a boot's microsecond) moves every stored instant of the
Run tables back by as much. After each step the stored records are compared with the
world's, field by field, each instant only as unset, past or future
(:func:`.common.shape`). The worlds step the clock to a microsecond
before an instant (a timer's due time, a consent's deadline, a lease's end) to test that
boundary; the database's clock, which keeps running while the replay works, cannot hold
a microsecond: a step at which some instant lies ahead of the world's clock by no more
than the real time that has passed since the step that wrote it is reported ``not
replayable`` and ends the replay (before its decisions are sent, or after, when it
became so while they ran). The reasoning is in :mod:`.common`. Recovery's
verdicts are the world's (the replay sends the decisions they lead to, not the
verdicts), so a mutant of the recovery table reaches the database only through those.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

from tenure.adapters import RunLedger
from tenure.adapters.agent_jobs.table import AGENT_JOBS_BINDING
from tenure.adapters.consents.table import CONSENTS_BINDING
from tenure.adapters.core.engine import raise_if_conflict
from tenure.adapters.core.store import Transaction
from tenure.adapters.core.tables import Binding
from tenure.adapters.core.urls import parse_db_url
from tenure.adapters.nodes.table import NODES_BINDING
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.adapters.runs.engine import RunEngine
from tenure.kernel.agent_jobs import finders as job_finders
from tenure.kernel.agent_jobs.commands import SubmitJob
from tenure.kernel.consents import finders as consent_finders
from tenure.kernel.consents.commands import CreateConsent
from tenure.kernel.core import Applied, Decision, Finder, Machine
from tenure.conformance.explore.engine import Step
from tenure.conformance.explore.runs import Decided, RunModel, RunWorld
from tenure.kernel.nodes import machine as node_machine
from tenure.kernel.nodes.commands import Boot
from tenure.kernel.runs import finders as run_finders
from tenure.kernel.runs.commands import Admit, Park
from tenure.kernel.runs.machine import RUNS
from tenure.kernel.runs.record import opens_owners
from tenure.model import ConsentStatus

from .queue import ReplayedStep
from .common import (
    NOT_REPLAYABLE,
    answer_of,
    differing,
    instant_columns,
    kernel_answer,
    script_main,
    script_text,
    shape,
    shift_instants,
)

__all__ = ["prelude", "replay_run_trace", "replay_script", "main", "SWEEP_ACTOR"]

SWEEP_ACTOR = "ledger (sweep)"
"""The actor of the consent decisions a Run decision's sweep makes in the world."""

_PLANNING_SLACK_US = 250_000
"""How much real time the replay allows a step's decisions to take, when it decides
before sending them that the database can follow the step (the check after the step,
on the clock read once they were made, is exact)."""

_INSTANT_COLUMNS = instant_columns([RUNS_BINDING, DELIVERIES_BINDING, CONSENTS_BINDING, AGENT_JOBS_BINDING,
                                    NODES_BINDING])
"""Every instant column of the Run tables, moved back on a step of the clock."""


# --- the machines, as data --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Kind:
    """One machine's records in the world and in the database."""

    field: str
    """The ``RunWorld`` field holding its records, by slot."""
    machine: Machine
    key: Callable[[Any], str]
    parts: Callable[[Any], dict[str, Any]]
    """The record's rows, by the prefix their fields get in the comparison (a Run is its
    Run row and its current delivery)."""
    label: Callable[[Any], str]


_KINDS: dict[str, _Kind] = {
    "runs": _Kind("runs", RUNS, lambda pair: pair.run.run_id, lambda pair: {"": pair.run, "delivery.": pair.current},
                  lambda pair: f"{pair.run.run_id} {pair.run.status.value}@{pair.run.enqueue_seq}"
                               f" ({pair.current.state.value})"),
    "consent": _Kind("consents", CONSENTS_BINDING.machine, lambda row: row.consent_id, lambda row: {"": row},
                     lambda row: f"{row.consent_id} {row.status.value}"),
    "agent_jobs": _Kind("jobs", AGENT_JOBS_BINDING.machine, lambda row: row.job_id, lambda row: {"": row},
                        lambda row: f"{row.job_id} {row.status.value}"),
    "nodes": _Kind("nodes", NODES_BINDING.machine, lambda row: row.node, lambda row: {"": row},
                   lambda row: f"{row.node} {row.status.value}#{row.epoch}"),
}
"""The four machines of a Run world, by the name a ``Decided`` gives its machine."""

_INSERTED_KEY: dict[type[Any], Callable[[Any], str]] = {
    Admit: lambda command: command.run.run_id,
    CreateConsent: lambda command: command.row.consent_id,
    SubmitJob: lambda command: command.row.job_id,
    Boot: lambda command: command.node,
}
"""The key of the record a command meets when it met none (it inserts)."""


def _key_of(decided: Decided) -> str:
    kind = _KINDS[decided.machine]
    if decided.before is not None:
        return kind.key(decided.before)
    return _INSERTED_KEY[type(decided.command)](decided.command)


# --- the prelude: how the world's initial state came to be -------------------------------------


class _Watched(RunModel):
    """The Run model, keeping every Run decision its initial construction makes."""

    def __init__(self, model: RunModel) -> None:
        super().__init__(model.bounds)
        self.watched: list[Decided] = []

    def _run(self, world: RunWorld, slot: int, command: Any, actor: str) -> tuple[RunWorld, Any]:
        after, decision = super()._run(world, slot, command, actor)
        self.watched.extend(after.last[len(world.last):])
        return after, decision


def prelude(model: RunModel) -> tuple[Decided, ...]:
    """The decisions that made ``model``'s initial world: each node's boot (the world
    boots them with the kernel directly), then the admissions (and, in a world that
    starts with a claimed Run, its publication and claim) as the model made them."""
    watched = _Watched(model)
    initial = watched.initial()
    boots = []
    for index, row in enumerate(initial.nodes):
        if row is None:
            continue
        boot = Boot(node=row.node, lease_us=row.lease_expires_at_us - row.booted_at_us)
        decision = node_machine.NODES.decide(None, boot, initial.now_us)
        boots.append(Decided("nodes", index, boot, None, decision, initial.now_us, row.node))
    return (*boots, *watched.watched)


# --- sending a decision ----------------------------------------------------------------------


async def _create_consent(tx_kit: RunEngine, command: CreateConsent) -> Decision:
    """The consents facade's creation, for the world's row: the Run locked first, and
    whether it may ask read from the database."""
    async def body(tx: Transaction) -> Decision:
        runs = await tx.locked(RUNS_BINDING, run_finders.runs_by_keys, {"keys": [command.row.run_id]})
        observed = dataclasses.replace(command, run_running=bool(runs) and opens_owners(runs[0]))
        decision = await tx_kit.engine.decide_one(tx, CONSENTS_BINDING, None, observed)
        raise_if_conflict(CONSENTS_BINDING, decision)
        return decision

    return await tx_kit.run(body)


async def _submit_job(tx_kit: RunEngine, command: SubmitJob) -> Decision:
    """The delegated jobs facade's submission, for the world's row (its named lock, the
    Run, then the job, as the facade takes them)."""
    job_id = command.row.job_id

    async def body(tx: Transaction) -> Decision:
        await tx.lock_name(f"tenure:agent-job:{job_id}")
        runs = await tx.locked(RUNS_BINDING, run_finders.runs_by_keys, {"keys": [command.row.run_id]})
        jobs = await tx.locked(AGENT_JOBS_BINDING, job_finders.jobs_by_keys, {"keys": [job_id]})
        observed = dataclasses.replace(command, run_running=bool(runs) and opens_owners(runs[0]))
        decision = await tx_kit.engine.decide_one(tx, AGENT_JOBS_BINDING, jobs[0] if jobs else None, observed)
        raise_if_conflict(AGENT_JOBS_BINDING, decision)
        return decision

    return await tx_kit.run(body)


async def _send_run(ledger: RunLedger, key: str, command: Any) -> Decision:
    """A Run command through the Run engine, which reads the evidence the aggregate
    declares from the replay's database and completes the command with it."""
    return (await ledger.engine.send(key, command)).decision


def _on_row(binding: Binding, finder: Finder) -> Callable[[RunLedger, str, Any], Awaitable[Decision]]:
    """A command on one row through the engine, as the consents and jobs facades send it."""
    async def send(ledger: RunLedger, key: str, command: Any) -> Decision:
        async with ledger.engine.errors():
            decisions = await ledger.engine.engine.on_keys(binding, [(key, command)], finder,
                                                                 raise_conflicts=True)
        return decisions[0]

    return send


_SENDERS: dict[tuple[str, type[Any] | None], Callable[[RunLedger, str, Any], Awaitable[Decision]]] = {
    ("runs", None): _send_run,
    ("consent", CreateConsent): lambda ledger, key, command: _create_consent(ledger.engine, command),
    ("consent", None): _on_row(CONSENTS_BINDING, consent_finders.consents_by_keys),
    ("agent_jobs", SubmitJob): lambda ledger, key, command: _submit_job(ledger.engine, command),
    ("agent_jobs", None): _on_row(AGENT_JOBS_BINDING, job_finders.jobs_by_keys),
    ("nodes", None): lambda ledger, key, command: ledger.nodes.send(key, command),
}
"""How each machine's commands reach the database: by (machine, command type), else by
machine (None)."""


async def _database_now(ledger: RunLedger) -> int:
    async def body(tx: Transaction) -> int:
        return await tx.now_us()

    return await ledger.engine.run(body, write=False)


async def _answer(ledger: RunLedger, decided: Decided, world_now_us: int) -> str:
    command = decided.command
    if isinstance(command, Park) and command.wake_at_us is not None:
        # The one absolute instant a command carries, moved onto the database's clock.
        database_now = await _database_now(ledger)
        command = dataclasses.replace(command, wake_at_us=database_now + (command.wake_at_us - world_now_us))
    send = _SENDERS.get((decided.machine, type(command))) or _SENDERS[(decided.machine, None)]
    key = _key_of(decided)
    return await answer_of(_KINDS[decided.machine].machine, lambda: send(ledger, key, command))


# --- the stored records ----------------------------------------------------------------------


Stored = dict[str, dict[str, Any]]
"""The database's records by machine, then by key."""


async def _read_stored(ledger: RunLedger, keys: dict[str, list[str | None]]) -> tuple[Stored, int]:
    bindings = {"consent": CONSENTS_BINDING, "agent_jobs": AGENT_JOBS_BINDING, "nodes": NODES_BINDING}

    async def body(tx: Transaction) -> tuple[Stored, int]:
        stored: Stored = {"runs": {}}
        for run_id in filter(None, keys["runs"]):
            pair = await RunEngine.read_pair(tx, run_id)
            if pair is not None:
                stored["runs"][run_id] = pair
        for machine, binding in bindings.items():
            rows = await tx.read(binding, [key for key in keys[machine] if key is not None])
            stored[machine] = {_KINDS[machine].key(row): row for row in rows}
        return stored, await tx.now_us()

    return await ledger.engine.run(body, write=False)


def _shape_of(kind: _Kind, record: Any, now_us: int) -> dict[str, Any]:
    return {prefix + name: value for prefix, row in kind.parts(record).items()
            for name, value in shape(row, now_us).items()}


def _stored_line(world: RunWorld, stored: Stored, database_now: int,
                 keys: dict[str, list[str | None]]) -> tuple[str, str]:
    """(the world's records, the database's), one part per record either side has; a
    database record that differs in a field its label does not show names it."""
    kernel_parts, database_parts = [], []
    for machine, kind in _KINDS.items():
        for slot, key in enumerate(keys[machine]):
            record = getattr(world, kind.field)[slot]
            found = None if key is None else stored[machine].get(key)
            if record is None and found is None:
                continue
            kernel_parts.append("absent" if record is None else kind.label(record))
            shown = "absent" if found is None else kind.label(found)
            if record is not None and found is not None:
                shown += differing(_shape_of(kind, record, world.now_us), _shape_of(kind, found, database_now))
            database_parts.append(shown)
    return "; ".join(kernel_parts), "; ".join(database_parts)


def _sweep_answer(before: Stored, after: Stored, decided: Decided) -> str:
    """What a Run decision's sweep did to one consent in the database."""
    key = _key_of(decided)
    old, new = before["consent"].get(key), after["consent"].get(key)
    swept = (old is not None and new is not None and old.status is ConsentStatus.PENDING
             and new.status is ConsentStatus.CANCELLED)
    return "swept" if swept else "not swept"


# --- the clock the database can follow ----------------------------------------------------------


Instant = tuple[str, int, str]
"""An instant field of a world record: (machine, slot, field; a delivery's prefixed)."""


def _instants(world: RunWorld) -> Iterator[tuple[Instant, int]]:
    for machine, kind in _KINDS.items():
        for slot, record in enumerate(getattr(world, kind.field)):
            if record is None:
                continue
            for prefix, row in kind.parts(record).items():
                for field in dataclasses.fields(row):
                    value = getattr(row, field.name)
                    if field.name.endswith("_us") and value is not None:
                        yield (machine, slot, prefix + field.name), value


class _Ages:
    """Since when (on the database's clock, read before the step that wrote it) each
    world instant has held its value: the database's counterpart of an instant is behind
    the world's by at most the real time since then (see :mod:`.common`)."""

    def __init__(self) -> None:
        self._since: dict[Instant, tuple[int, int]] = {}

    def settle(self, world: RunWorld, step_began_us: int) -> None:
        """The step that began at ``step_began_us`` left ``world``: instants it changed date from then."""
        for instant, value in _instants(world):
            if self._since.get(instant, (None, 0))[0] != value:
                self._since[instant] = (value, step_began_us)

    def tightest(self, worlds: Sequence[RunWorld], commands: Sequence[Any], now_us: int, step_began_us: int,
                 database_now_us: int) -> tuple[int, int] | None:
        """(how far ahead of the world's clock ``now_us`` it lies, its margin) of the
        instant ahead whose margin (how far ahead, less the real time it may have fallen
        behind by ``database_now_us``) is the smallest; None: no instant is ahead. An
        instant this step brings (in a command, or written by a decision) dates from
        ``step_began_us``."""
        found = [(value, self._since.get(instant, (None, step_began_us)))
                 for world in worlds for instant, value in _instants(world)]
        found += [(command.wake_at_us, (None, step_began_us)) for command in commands
                  if isinstance(command, Park) and command.wake_at_us is not None]
        margins = [(value - now_us, value - now_us - (database_now_us - (since if known == value else step_began_us)))
                   for value, (known, since) in found if value > now_us]
        return min(margins, key=lambda pair: pair[1], default=None)


def _not_replayable(number: int, tightest: tuple[int, int]) -> ReplayedStep:
    ahead_us, _ = tightest
    return ReplayedStep(number, "", "the database clock", f"an instant {ahead_us} us ahead", NOT_REPLAYABLE)


# --- the replay ---------------------------------------------------------------------------------


def _keys(initial: RunWorld, trace: Sequence[tuple[Step, RunWorld]], decisions: Sequence[Decided]
          ) -> dict[str, list[str | None]]:
    """Each machine's record key by slot, as any world or decision of the trace names it."""
    keys: dict[str, list[str | None]] = {machine: [None] * len(getattr(initial, kind.field))
                                         for machine, kind in _KINDS.items()}
    for world in (initial, *(world for _, world in trace)):
        for machine, kind in _KINDS.items():
            for slot, record in enumerate(getattr(world, kind.field)):
                keys[machine][slot] = keys[machine][slot] or (None if record is None else kind.key(record))
    for decided in decisions:
        keys[decided.machine][decided.slot] = keys[decided.machine][decided.slot] or _key_of(decided)
    return keys


async def _decide_all(ledger: RunLedger, number: int, step: Step | None, decisions: Sequence[Decided],
                      world_now_us: int) -> list[tuple[ReplayedStep, Decided | None]]:
    """Send the step's decisions in order; a sweep's answer is filled in once the rows are read."""
    actor = "" if step is None else step.actor
    action = "(initial)" if step is None else step.action + (f" {step.detail}" if step.detail else "")
    if not decisions:
        return [(ReplayedStep(number, actor, action, "-", "-"), None)]
    lines: list[tuple[ReplayedStep, Decided | None]] = []
    for decided in decisions:
        what = f"{action}: {decided.machine} {type(decided.command).__name__}"
        if decided.actor == SWEEP_ACTOR:
            kernel = "swept" if isinstance(decided.decision, Applied) else "not swept"
            lines.append((ReplayedStep(number, actor, what, kernel, ""), decided))
            continue
        database = await _answer(ledger, decided, world_now_us)
        lines.append((ReplayedStep(number, actor, what, kernel_answer(decided.decision), database), None))
    return lines


async def _replay(db_url: str, steps: Sequence[tuple[int, Step | None, RunWorld, RunWorld, Sequence[Decided]]],
                  keys: dict[str, list[str | None]]) -> list[ReplayedStep]:
    ledger = RunLedger(db_url)
    replayed: list[ReplayedStep] = []
    ages = _Ages()
    try:
        stored, _ = await _read_stored(ledger, keys)
        for number, step, previous, world, decisions in steps:
            # The clock stepped on (or a boot's microsecond): every stored instant moves back as much.
            await shift_instants(db_url, _INSTANT_COLUMNS, world.now_us - previous.now_us)
            began = await _database_now(ledger)
            commands = [decided.command for decided in decisions]
            tightest = ages.tightest((previous, world), commands, world.now_us, began, began + _PLANNING_SLACK_US)
            if tightest is not None and tightest[1] <= 0:
                replayed.append(_not_replayable(number, tightest))
                break
            lines = await _decide_all(ledger, number, step, decisions, world.now_us)
            before, (stored, database_now) = stored, await _read_stored(ledger, keys)
            replayed += [line if sweep is None else dataclasses.replace(line, database=_sweep_answer(before, stored, sweep))
                         for line, sweep in lines]
            # Exact now: every decision of the step was made before this clock reading.
            tightest = ages.tightest((previous, world), commands, world.now_us, began, database_now)
            if tightest is not None and tightest[1] <= 0:
                replayed.append(_not_replayable(number, tightest))
                break
            replayed.append(ReplayedStep(number, "", "stored", *_stored_line(world, stored, database_now, keys)))
            ages.settle(world, began)
    finally:
        await ledger.close()
    return replayed


def replay_run_trace(db_url: str, prelude: Sequence[Decided], initial: RunWorld,
                     trace: Sequence[tuple[Step, RunWorld]]) -> list[ReplayedStep]:
    """Replay ``prelude`` (the decisions that made ``initial``, as step 0) and then
    ``trace`` against the migrated, empty database ``db_url``; see the module's docstring."""
    parse_db_url(db_url)
    empty = dataclasses.replace(initial, last=())
    steps: list[tuple[int, Step | None, RunWorld, RunWorld, Sequence[Decided]]] = [
        (0, None, empty, initial, tuple(prelude))]
    previous = initial
    for number, (step, world) in enumerate(trace, start=1):
        steps.append((number, step, previous, world, world.last))
        previous = world
    keys = _keys(initial, trace, [decided for *_, decisions in steps for decided in decisions])
    return asyncio.run(_replay(db_url, steps, keys))


# --- the script ---------------------------------------------------------------------------------


def replay_script(model: RunModel, initial: RunWorld, trace: Sequence[tuple[Step, RunWorld]], table: str) -> str:
    """A Python script that replays ``trace`` (of ``model``'s world, from ``initial``)
    against the database its ``--db`` (or ``TENURE_DB``) names, in a scratch area it
    removes: exit 0 when the database answers every decision and stores every record as
    the trace's kernels did, 1 when it does not (or cannot follow the trace), 2 when it
    cannot run."""
    import base64
    import pickle

    # The recovery verdicts' ghost (each with the world it was decided in) is left out:
    # the replay sends decisions, not verdicts.
    bare = tuple((step, dataclasses.replace(world, judged=())) for step, world in trace)
    recorded = base64.b64encode(pickle.dumps((prelude(model), initial, bare))).decode()
    return script_text("explore.replays.runs", "workflow Runs", recorded, table)


def main(recorded: str, argv: Sequence[str]) -> int:
    """What a written Run replay script runs (see :func:`replay_script`)."""
    return script_main(recorded, argv, lambda db_url, trace: replay_run_trace(db_url, *trace))
