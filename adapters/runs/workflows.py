"""Workflows a Run worker executes, and the context a hop gives them.

A workflow is an async function ``fn(ctx: RunContext) -> None`` registered under a name
and a revision. Its pin (name, revision and a content digest) is what a Run is admitted
with (:meth:`Workflows.pin`), and a worker runs a claimed hop only when its registry holds
the exact pin: a worker whose code changed since admission fails the Run
(``workflow_unavailable``) instead of guessing. The digest is a SHA-256 over the name,
the revision and the function's source text (its qualified name when the source cannot
be read), so an edit without a new revision is caught too; pass ``digest=`` to pin
something else (a package version, a build ID).

A hop is one call of the function. Returning settles the Run DONE, keeping what it
returned (a JSON object of at most 1 MiB, or None; anything else settles it FAILED
``workflow_result_invalid``) as the Run's ``result``; raising settles it FAILED with
``workflow_error:<ExceptionType>: <message>`` (the message cleaned and bounded; a
RunWorker made with ``store_error_text=False`` stores the type alone, for workflows whose
messages may carry payload).

A hop that dies with its process is failed ``lost`` by recovery, unless the workflow
declares its hops safe to repeat: ``register(..., on_lost="retry", max_hop_retries=N)``
(N from 1 to 100, default 3) lets recovery run such a hop again, at most N times per
Run, before it fails the Run ``lost``. The allowance is part of the pin, so it is
admitted with the Run and a worker whose declaration changed does not run it. To wait, the workflow saves a checkpoint and parks through the context:
:meth:`RunContext.request_consent`, :meth:`RunContext.delegate` and
:meth:`RunContext.call_service` end the hop (they raise :class:`HopParked`, which a
workflow must let through: it derives from ``BaseException`` so that ``except
Exception`` does not swallow it), and the hop that resumes the Run later gets
``ctx.resumed``, the checkpoint's ``ctx.state`` and the decided owner (``ctx.consent``,
``ctx.job`` or ``ctx.attempt``). :meth:`RunContext.receive` returns a message of a topic
at once when one is there, else parks the same way (``ctx.receive_answer``). :meth:`RunContext.wait_for_hardware` waits within the same
hop. A hop that lost its Run (cancelled, superseded) gets :class:`HopLost` from any of
these calls and from nothing else: the worker notices the loss on its own and cancels
the hop's task.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import functools
import hashlib
import inspect
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from tenure.kernel.attempts.record import is_terminal as attempt_is_terminal
from tenure.kernel.runs.machine import owner_decided
from tenure.kernel.runs.record import hop_holds
from tenure.model import (
    AgentJobRecord,
    ConsentRecord,
    ErrorCode,
    MessageRecord,
    ReceiveAnswer,
    RunRecord,
    TenureError,
    WaitKind,
    WorkflowPin,
)
from tenure.model.attempts import AttemptRecord, AttemptSpec
from tenure.model.runs import MAX_HOP_RETRIES
from tenure.model.validation import refuse

from .checkpoints import Checkpoint
from .ledger import RunLedger, resume_and_publish

if TYPE_CHECKING:
    from ..attempts.runner import AttemptRunner
    from .broker import Broker

__all__ = ["Workflows", "RunContext", "HopParked", "HopLost", "WorkflowDiverged", "Workflow", "resume_and_publish"]

Workflow = Callable[["RunContext"], Awaitable[Any]]
F = TypeVar("F", bound=Workflow)
T = TypeVar("T")
Retry = Callable[[str, Callable[[], Awaitable[Any]]], Awaitable[Any]]
"""``retry(what, call)``: ``call()`` repeated through database failures (see ``RunContext``)."""


class HopParked(BaseException):
    """The hop parked its Run on an owner: the hop is over, the Run waits."""


class HopLost(BaseException):
    """The hop does not hold its Run any more (cancelled, failed by recovery, or a later
    hop holds it): nothing it writes would apply, so it stops."""


class WorkflowDiverged(BaseException):
    """A replayed workflow asked, at a position of its step journal, for another call than
    the one recorded there (its code changed under the same version, or it called
    something outside its context that changed the order): the hop ends and the worker
    fails the Run ``workflow_diverged`` with :meth:`stored_text`, never guessing which call
    was meant. A ``BaseException``, like :class:`HopParked`, so that ``except Exception``
    in a workflow does not swallow it."""

    def __init__(self, position: int, recorded: str, asked: str) -> None:
        super().__init__(position, recorded, asked)
        self.position = position
        self.recorded = recorded
        self.asked = asked

    def stored_text(self) -> str:
        """The Run's stored error: the position and both calls (a call is its kind and the
        code's name for it, never an argument or an answer)."""
        return f"workflow_diverged: at position {self.position} the journal holds {self.recorded}, " \
               f"the workflow asked for {self.asked}"

    def __str__(self) -> str:
        return self.stored_text()


_refuse = functools.partial(refuse, reason="invalid_workflow")


DEFAULT_HOP_RETRIES = 3


def _retries(on_lost: object, max_hop_retries: object) -> int:
    """The pin's retry allowance for an ``on_lost`` policy."""
    if on_lost == "fail" and type(on_lost) is str:
        if max_hop_retries is not None:
            raise _refuse("max_hop_retries", "retries_need_on_lost_retry")
        return 0
    if on_lost != "retry" or type(on_lost) is not str:
        raise _refuse("on_lost", "fail_or_retry_required")
    if max_hop_retries is None:
        return DEFAULT_HOP_RETRIES
    if type(max_hop_retries) is not int or not 1 <= max_hop_retries <= MAX_HOP_RETRIES:
        raise _refuse("max_hop_retries", "integer_out_of_range")
    return max_hop_retries


def _digest(name: str, revision: str, fn: Callable[..., Any]) -> str:
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"
    return "sha256:" + hashlib.sha256(f"{name}\n{revision}\n{text}".encode()).hexdigest()


class Workflows:
    """A registry of workflow functions by name and revision."""

    def __init__(self) -> None:
        self._entries: dict[tuple[str, str], tuple[WorkflowPin, Workflow]] = {}

    def register(self, name: str, revision: str, fn: Workflow, *, digest: str | None = None,
                 on_lost: str = "fail", max_hop_retries: int | None = None) -> WorkflowPin:
        """Register ``fn`` (an ``async def``) under ``name`` and ``revision``; returns its
        pin. ``on_lost``: ``"fail"`` (a hop lost with its process fails the Run ``lost``)
        or ``"retry"`` (recovery runs it again, up to ``max_hop_retries`` times, default
        3). Registering the same pair twice raises (``workflow_registered``)."""
        if not inspect.iscoroutinefunction(fn):
            raise _refuse("fn", "async_function_required")
        retries = _retries(on_lost, max_hop_retries)
        pin = WorkflowPin(name, revision, digest if digest is not None else _digest(name, revision, fn), retries)
        if (pin.name, pin.revision) in self._entries:
            raise _refuse("name", "workflow_registered")
        self._entries[(pin.name, pin.revision)] = (pin, fn)
        return pin

    def workflow(self, name: str, revision: str, *, digest: str | None = None, on_lost: str = "fail",
                 max_hop_retries: int | None = None) -> Callable[[F], F]:
        """Decorator form of :meth:`register`."""
        def decorate(fn: F) -> F:
            self.register(name, revision, fn, digest=digest, on_lost=on_lost, max_hop_retries=max_hop_retries)
            return fn
        return decorate

    def pin(self, name: str, revision: str) -> WorkflowPin:
        """The pin to admit a Run with (``workflow_unknown`` when not registered)."""
        entry = self._entries.get((name, revision))
        if entry is None:
            raise _refuse("name", "workflow_unknown")
        return entry[0]

    def resolve(self, pin: WorkflowPin) -> Workflow | None:
        """The function of exactly this pin, or None (unknown, or its digest differs)."""
        entry = self._entries.get((pin.name, pin.revision))
        if entry is None or entry[0] != pin:
            return None
        return entry[1]

    def served(self) -> tuple[tuple[str, str], ...]:
        """The ``(name, version)`` of every registered workflow: what a worker of this
        registry claims (a Run of any other version is left for a worker that serves it)."""
        return tuple(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)


@dataclasses.dataclass(eq=False)
class RunContext:
    """What one hop of a Run's workflow sees. ``run`` is the Run as claimed;
    ``resumed`` says whether this hop resumes a wait; ``checkpoint`` is the Run's
    snapshot on a resumed hop (``state`` its workflow state: the state saved last) and
    exactly one of ``consent``, ``job``, ``attempt`` or ``receive_answer`` is the decided
    owner it resumed from (none for a timer: ``timer``). A hop that runs in place of a lost one (a
    retry, or a re-park and resume) sees the same: a plain save keeps the owner the
    checkpoint binds, so a resumed hop that saved and died resumes again from the same
    owner, with the state it saved last; a retried fresh hop gets the checkpoint its
    lost try saved, if any, for ``state`` (``resumed`` False, no owner)."""

    run: RunRecord
    enqueue_seq: int
    resumed: bool
    checkpoint: Checkpoint | None
    consent: ConsentRecord | None
    job: AgentJobRecord | None
    attempt: AttemptRecord | None
    _ledger: RunLedger
    _broker: Broker
    parked: bool = False
    """Set as this hop starts to park, before the park commits: from then on the worker's
    watch leaves the hop alone (a Run that no longer holds its hop because the hop itself
    parked it is no lost hop). A park the ledger refuses ends the hop with ``HopLost``."""
    checkpointed: bool = False
    """This hop wrote a checkpoint (so a finished Run has one to delete)."""
    _steps: dict[str, Any] | None = None
    """The step journal as this hop read it first, with what it recorded since."""
    _retry: Retry | None = None
    """How this hop's ledger calls go through database failures: ``_retry(what, call)``
    repeats ``call()`` after each one until the database answers (the worker's retry,
    with its backoff and its one warning per run of failures). None: called once."""
    receive_answer: ReceiveAnswer | None = None
    """The answer of the receive this hop resumed from (a message, or the receive's
    timeout), as :meth:`receive` returns it; None: it did not resume from a receive."""

    @property
    def run_id(self) -> str:
        return self.run.run_id

    async def _call(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, one of this hop's ledger calls, retried through database failures:
        a Run is never failed because its database was briefly unavailable (a workflow
        would see the failure as its own error). The hop's fence keeps the retries safe:
        a hop that lost its Run meanwhile gets False (then ``HopLost``) when the database
        answers again; a stop or an abort cancels the wait."""
        if self._retry is None:
            return await call()
        answer: T = await self._retry(what, call)
        return answer

    async def retrying(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """``call()``, a ledger call a replayed workflow makes for this hop (admitting a
        child Run, recording the child's identity on its job), retried through database
        failures as the hop's own calls are (:meth:`_call`): ``call`` must be safe to
        repeat after a COMMIT that applied unacknowledged."""
        return await self._call(what, call)

    async def _write(self, what: str, write: Callable[[], Awaitable[bool]],
                     applied: Callable[[RunRecord], bool]) -> bool:
        """A fenced write of this hop (True: it applied), retried through database
        failures. A retry answering False after a failure may follow a try whose COMMIT
        applied unacknowledged: the Run read afterwards says so (``applied``)."""
        tries = 0

        async def once() -> bool:
            nonlocal tries
            tries += 1
            return await write()

        if await self._call(what, once):
            return True
        if tries == 1:
            return False
        run = await self._call(what, lambda: self._ledger.get(self.run_id))
        return run is not None and applied(run)

    def _parked_on(self, kind: WaitKind, owner_id: str) -> Callable[[RunRecord], bool]:
        """Whether a Run read back is parked by this hop on ``owner_id`` (a park that
        applied unacknowledged)."""
        return lambda run: (run.enqueue_seq, run.owner_kind, run.owner_id) == (self.enqueue_seq, kind, owner_id)

    def _holds(self, run: RunRecord) -> bool:
        return hop_holds(run, self.enqueue_seq)

    @property
    def payload(self) -> Any:
        return self.run.payload

    @property
    def state(self) -> Any:
        return None if self.checkpoint is None else self.checkpoint.state

    async def step(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn(*args)`` (a function or an ``async`` one) once per Run under ``name`` and
        return its JSON result. The result is recorded in the step journal, fenced by this
        hop's sequence (a hop that lost its Run gets :class:`HopLost` and records nothing);
        a hop that runs the workflow again (a retry of a lost hop, a resume) gets the
        recorded result back without running ``fn``. Before ``fn`` runs, the hop checks
        that it still holds the Run, so a hop that already lost it runs no step. An
        external effect belongs in a service attempt (``call_service``): a step whose
        process dies between its body and its record runs again in the next hop."""
        steps = self._ledger.steps
        journal = await self.journal()
        if name in journal:
            return journal[name]
        if not await self._call("step journal", lambda: steps.holds(self.run_id, self.enqueue_seq)):
            raise HopLost()
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
        # Recording again after a failure is safe: the first record of a name wins.
        held, kept = await self._call("step journal", lambda: steps.record(self.run_id, self.enqueue_seq, name, value))
        if not held:
            raise HopLost()
        journal[name] = kept
        return kept

    async def journal(self) -> dict[str, Any]:
        """The Run's step journal by step name, as this hop read it first (once, on first
        use) with what it recorded since."""
        if self._steps is None:
            steps = self._ledger.steps
            self._steps = await self._call("step journal", lambda: steps.recorded(self.run_id))
        return self._steps

    async def save(self, state: Any) -> None:
        """Write a plain checkpoint for this hop: the state a hop that runs in its place
        starts from (``ctx.state``). It keeps the owner the checkpoint binds (a resumed
        hop's: the owner it resumed from), so such a hop still resumes from it."""
        self.checkpointed = True
        save = self._ledger.checkpoints.save
        if not await self._call("checkpoint", lambda: save(self.run_id, self.enqueue_seq, state=state)):
            raise HopLost()

    async def _park(self, kind: WaitKind, owner_id: str, state: Any) -> None:
        # The seed's order: owner row, checkpoint naming it, then the park that makes it
        # authoritative. A crash between checkpoint and park is re-parked by recovery
        # because the checkpoint binds the Run's latest owner.
        self.checkpointed = True
        save = self._ledger.checkpoints.save
        if not await self._call("checkpoint", lambda: save(self.run_id, self.enqueue_seq, state=state, owner_kind=kind,
                                                          owner_id=owner_id)):
            raise HopLost()
        self.parked = True  # before the commit: the watch must not read the parked Run as lost
        park = self._ledger.park
        if not await self._write("park", lambda: park(self.run_id, self.enqueue_seq, kind=kind, owner_id=owner_id),
                                 self._parked_on(kind, owner_id)):
            raise HopLost()

    async def _refire(self, owner_id: str) -> NoReturn:
        # An owner decided before the park (a preauthorized consent, a job that ended
        # at once) resumes the Run now; otherwise its decider or the relay does. The
        # park is done: a database failure here leaves the resume to the relays.
        try:
            await resume_and_publish(self._ledger, self._broker, self.run_id, owner_id=owner_id)
        except TenureError as error:
            if error.code is not ErrorCode.RUN_PERSISTENCE_FAILED:
                raise
        raise HopParked()

    async def request_consent(self, *, tool_name: str, tool_call_id: str, payload: Any, state: Any,
                              preauthorized_by: str | None = None, expires_in_s: float | None = None) -> NoReturn:
        """Ask for consent to one tool call and park AWAITING_CONSENT; the hop ends. The
        hop resumed by the verdict sees it as ``ctx.consent`` (granted, denied or expired).
        With ``expires_in_s`` (more than 0, at most 30 days) the consent has a deadline:
        a relay round after it passed decides it expired (``tenure:deadline``) unless a
        verdict came first, and resumes the Run."""
        try:
            consent = await self._call("consent", lambda: self._ledger.consents.create(
                self.run_id, tool_name=tool_name, tool_call_id=tool_call_id, payload=payload,
                preauthorized_by=preauthorized_by, expires_in_s=expires_in_s))
        except TenureError as error:
            if error.code is ErrorCode.RUN_OWNER_MISMATCH:  # the Run is not RUNNING any more
                raise HopLost() from None
            raise
        await self._park(WaitKind.CONSENT, consent.consent_id, state)
        await self._refire(consent.consent_id)

    async def delegate(self, *, request_id: str, runtime: str, profile: str, request: Any, state: Any) -> NoReturn:
        """Record a delegated job and park AWAITING_DELEGATE; the hop ends. Whoever runs
        the job adopts its result (``RunLedger.jobs.adopt_result``) and resumes the Run
        (:func:`resume_and_publish`, or the relay); the resumed hop sees ``ctx.job``."""
        job = await self.submit_job(request_id=request_id, runtime=runtime, profile=profile, request=request)
        await self._park(WaitKind.DELEGATE, job.job_id, state)
        await self._refire(job.job_id)

    async def submit_job(self, *, request_id: str, runtime: str, profile: str, request: Any) -> AgentJobRecord:
        """Record a delegated job of this Run without parking (once per ``request_id``: the
        same request answers the same job); :meth:`delegate` parks on it. A hop whose Run
        is not RUNNING any more gets :class:`HopLost`."""
        try:
            # Submitting again after a failure is safe: the same request answers the same job.
            return await self._call("delegated job", lambda: self._ledger.jobs.submit(
                self.run_id, request_id=request_id, runtime=runtime, profile=profile, request=request))
        except TenureError as error:
            if error.code is ErrorCode.RUN_OWNER_MISMATCH:
                raise HopLost() from None
            raise

    @property
    def ledger(self) -> RunLedger:
        """The Run ledger this hop writes through."""
        return self._ledger

    async def call_service(self, runner: AttemptRunner, spec: AttemptSpec, *, state: Any) -> NoReturn:
        """Prepare a service attempt of this Run, park AWAITING_SERVICE and run the attempt
        (still in this worker task, which the park released from the Run); once it is
        terminal the Run resumes and the next hop sees ``ctx.attempt``. An attempt the
        provider cannot settle yet (INDETERMINATE) is left to the relay's
        ``observe_attempt``. ``spec.run_id`` must be this Run."""
        if type(spec) is not AttemptSpec or spec.run_id != self.run_id:
            raise _refuse("spec", "attempt_of_this_run_required")
        attempt_id = await runner.ledger.prepare(spec)
        await self._park(WaitKind.SERVICE, attempt_id, state)
        record = await runner.run(attempt_id)
        if attempt_is_terminal(record):
            await self._refire(attempt_id)
        raise HopParked()

    async def sleep_until(self, when: dt.datetime, *, state: Any = None, name: str | None = None) -> NoReturn:
        """Park the Run on a durable timer due at ``when`` (an aware datetime, compared
        with the database clock); the hop ends. The checkpoint (``state``) and the park
        are one transaction. A relay resumes the Run once the database clock reaches
        ``when`` (across restarts: nothing is held in memory), and the next hop sees
        ``ctx.timer`` (the timer's name) and ``ctx.state``. ``name`` defaults to
        ``sleep:<sequence>``."""
        await self._sleep(name, state, wake_at=when)

    async def sleep(self, seconds: float, *, state: Any = None, name: str | None = None) -> NoReturn:
        """Park the Run on a durable timer due ``seconds`` after the database clock
        (0 to 366 days); see :meth:`sleep_until`."""
        await self._sleep(name, state, delay_s=seconds)

    async def _sleep(self, name: str | None, state: Any, **due: Any) -> NoReturn:
        timer = f"sleep:{self.enqueue_seq}" if name is None else name
        self.checkpointed = True
        self.parked = True  # before the commit: the watch must not read the parked Run as lost
        park = self._ledger.park_timer
        if not await self._write("timer", lambda: park(self.run_id, self.enqueue_seq, name=timer, state=state, **due),
                                 self._parked_on(WaitKind.TIMER, timer)):
            raise HopLost()
        await self._refire(timer)  # a timer already due resumes now

    async def receive(self, topic: str, *, key: str, timeout_s: float | None = None,
                      state: Any = None) -> ReceiveAnswer:
        """Receive a message of ``topic`` (see ``RunLedger.messages.send``). ``key`` names
        this receive within the Run (1 to 128 characters; the replay layer passes its
        journal position, e.g. ``"@3"``), which makes it replay-safe:

        - a receive stored under ``key`` that has its answer returns it at once (the same
          message, or the timeout), whichever hop asks again;
        - otherwise the Run's first undelivered message of ``topic`` (the lowest
          sequence) is taken by this receive, in one transaction fenced by this hop
          holding its Run, and returned without parking;
        - otherwise the receive waits, with a deadline ``timeout_s`` after the database
          clock (more than 0, at most 366 days; None: no timeout), and the Run parks
          AWAITING_MESSAGE on it (the seed's order: the receive, the checkpoint naming it
          with ``state``, the park); the hop ends (:class:`HopParked`). A message of
          ``topic`` sent meanwhile resumes the Run, and so does a relay round once the
          deadline passed (the answer is then TIMED_OUT); the hop that resumes it sees
          the answer as ``ctx.receive_answer`` and gets it again from the same call.

        A hop that lost its Run gets :class:`HopLost`; the same ``key`` for another topic
        raises ``RUN_MESSAGE_CONFLICT``."""
        try:
            slot = await self._call("message", lambda: self._ledger.messages.receive(
                self.run_id, self.enqueue_seq, topic, key=key, timeout_s=timeout_s))
        except TenureError as error:
            if error.code is ErrorCode.RUN_OWNER_MISMATCH:  # the hop does not hold its Run any more
                raise HopLost() from None
            raise
        answer = slot.answer
        if answer is not None:
            return answer
        await self._park(WaitKind.MESSAGE, slot.slot_id, state)
        await self._refire(slot.slot_id)

    @property
    def timer(self) -> str | None:
        """The name of the timer this hop woke from (None: it did not wake from one)."""
        checkpoint = self.checkpoint
        if self.resumed and checkpoint is not None and checkpoint.owner_kind is WaitKind.TIMER:
            return checkpoint.owner_id
        return None

    async def wait_for_hardware(self, ready: Callable[[], Awaitable[bool]], *, state: Any, timeout_s: float = 60.0,
                                poll_s: float = 0.5) -> bool:
        """Checkpoint, mark AWAITING_HARDWARE, poll ``ready()`` until it answers True or
        ``timeout_s`` passes, then return to RUNNING in the same hop: True when ready."""
        await self.save(state)
        # A retry answering False after a failure: the hop still holding its Run means
        # the failed try applied (a retry from RUNNING would have).
        enter, leave = self._ledger.enter_hardware_wait, self._ledger.leave_hardware_wait
        if not await self._write("hardware wait", lambda: enter(self.run_id, self.enqueue_seq), self._holds):
            raise HopLost()
        deadline = asyncio.get_running_loop().time() + timeout_s
        became_ready = False
        try:
            while True:
                if await ready():
                    became_ready = True
                    break
                if asyncio.get_running_loop().time() >= deadline:
                    break
                await asyncio.sleep(poll_s)
        finally:
            left = await asyncio.shield(self._write("hardware wait", lambda: leave(self.run_id, self.enqueue_seq),
                                                    self._holds))
        if not left:
            raise HopLost()
        return became_ready


_RECORD_OF_KIND: dict[WaitKind, type[Any]] = {
    WaitKind.CONSENT: ConsentRecord, WaitKind.DELEGATE: AgentJobRecord, WaitKind.SERVICE: AttemptRecord,
    WaitKind.MESSAGE: MessageRecord,
}


def owner_is_decided(kind: WaitKind | None, owner: Any) -> bool:
    """Whether a resumed hop's owner record is one a resume may rest on (the Run
    kernel's :func:`owner_decided`, on the record of the owner's kind)."""
    record_type = _RECORD_OF_KIND.get(kind) if kind is not None else None
    if record_type is None or not isinstance(owner, record_type):
        return False
    state = owner.state if isinstance(owner, AttemptRecord) else owner.status
    return owner_decided(kind, state.value)
