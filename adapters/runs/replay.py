"""Workflows written straight through: every wait returns its answer, by replay.

A hop of a Run runs its workflow from the top. :class:`WorkflowContext` numbers the calls a
workflow makes through it (``step``, ``consent``, ``delegate``, ``call_service``,
``sleep``, ``sleep_until``) in the order it makes them, and keeps what each answered in the
Run's step journal (``tenure_run_steps``), one entry per position: the call (its kind and
the code's name for it) and its answer. So a later hop replays the journal:

- a position the journal holds answers at once with the recorded answer (a step's body
  does not run again, a consent is not asked again);
- the wait the Run parked on last (named, with its position, in the checkpoint the park
  wrote) answers with its decided owner (the verdict, the job's end, the attempt's end, the
  timer), which is recorded at that position first;
- every position after that runs for real: a step runs and is recorded, a wait parks the
  Run and ends the hop exactly as :class:`RunContext`'s waits do.

So ``verdict = await ctx.consent("refund", payload)`` is a plain line of code: the first
hop parks there; the hop that the verdict resumes runs the workflow again from the top,
every earlier call answers from the journal, and this one returns the verdict.

Determinism is checked, never assumed: a position whose recorded call differs from the
call the workflow asks for now, or a position before the Run's last wait that the journal
does not hold, raises :class:`WorkflowDiverged` (a ``BaseException``), and the worker fails
the Run ``workflow_diverged`` with both calls and the position in its stored error. A
workflow must therefore make the same calls in the same order on every hop: anything that
varies (the clock, randomness, a read of outside state) belongs in a ``step``, whose answer
is recorded once.

The journal and the checkpoint are written under the hop's fence (the Run's lock, the
hop's sequence): a hop that lost its Run records nothing (``HopLost``). A step whose
process dies between its body and its record runs again in the next hop (at most once per
hop): an external effect that must happen once belongs in a service attempt
(``call_service``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from tenure.kernel import replay
from tenure.model import AgentJobStatus, RunRecord
from tenure.model.validation import refuse

from .workflows import RunContext, WorkflowDiverged

if TYPE_CHECKING:
    from tenure.model.attempts import AttemptSpec

    from ..attempts.runner import AttemptRunner

__all__ = ["WorkflowContext", "ConsentAnswer", "JobAnswer", "ServiceAnswer", "ChildHandle", "ChildFailed",
           "ChildStarter", "JOURNAL_PREFIX", "REPLAY_STATE", "CHILD_RUNTIME", "child_job_result"]

JOURNAL_PREFIX = "@"
"""A replay position's name in the step journal: ``@0``, ``@1``, ... (a named step of
:meth:`RunContext.step` may not start with it in a replayed workflow)."""

REPLAY_STATE = "replay"
"""The key of the checkpoint state a replayed wait parks with: ``{"position": p, "call": c}``."""

_ADMITTED = AgentJobStatus.ADMITTED

CHILD_RUNTIME = "tenure:workflow"
"""The runtime of the delegated job that stands for a child Run in its parent."""

ChildStarter = Callable[[Any, Mapping[str, Any], str, RunRecord], Awaitable[str]]
"""``starter(flow, payload, key, parent)``: admit (once per ``key``) and publish a Run of
``flow`` (an app workflow) with ``payload`` for the Run ``parent``; its Run ID."""

_refuse = functools.partial(refuse, reason="invalid_workflow_call")


class ChildFailed(Exception):
    """``await child.result()`` of a child Run that did not end DONE: ``status`` is the
    delegated job's (``failed``, ``cancelled``), ``error`` the child Run's stored error.
    An ``Exception``: the parent may catch it (its answer is recorded like any other)."""

    def __init__(self, status: str, error: str | None) -> None:
        super().__init__(f"the child workflow Run ended {status}" + (f": {error}" if error else ""))
        self.status = status
        self.error = error


def child_job_result(job_id: str, status: str, result: Any, error: str | None) -> dict[str, Any]:
    """What a child Run's delegated job adopts when the child ended: ``status`` the job's
    terminal status, the child's result (DONE) or its error."""
    adopted: dict[str, Any] = {"job_id": job_id, "status": status}
    if status == "succeeded":
        adopted["result"] = result
    else:
        adopted["error"] = error or status
    return adopted


@dataclasses.dataclass(frozen=True, slots=True)
class ConsentAnswer:
    """A consent's verdict as a workflow receives it: ``status`` is ``granted``,
    ``denied`` or ``expired``; ``decided_by`` who decided (``tenure:deadline`` for an
    expiry)."""

    status: str
    decided_by: str | None

    @property
    def granted(self) -> bool:
        return self.status == "granted"


@dataclasses.dataclass(frozen=True, slots=True)
class JobAnswer:
    """How a delegated job ended: its terminal ``status`` (``succeeded``, ``failed``,
    ``cancelled``, ``timed_out``, ``lost``) and the ``result`` its runner adopted."""

    status: str
    result: Any

    @property
    def ok(self) -> bool:
        return self.status == "succeeded"


@dataclasses.dataclass(frozen=True, slots=True)
class ServiceAnswer:
    """How a service attempt ended: its terminal ``state`` (``succeeded``, ``failed`` or
    ``cancelled``), its ``attempt_id`` and what the provider reported."""

    attempt_id: str
    state: str
    result_refs: tuple[str, ...]
    diagnostic_refs: tuple[str, ...]
    usage: Any
    cost: Any

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"


def _consent(answer: Any) -> ConsentAnswer:
    return ConsentAnswer(answer["status"], answer["decided_by"])


def _job(answer: Any) -> JobAnswer:
    return JobAnswer(answer["status"], answer["result"])


def _service(answer: Any) -> ServiceAnswer:
    return ServiceAnswer(answer["attempt_id"], answer["state"], tuple(answer["result_refs"]),
                         tuple(answer["diagnostic_refs"]), answer["usage"], answer["cost"])


_DECODE: dict[str, Callable[[Any], Any]] = {
    "step": lambda answer: answer,
    "consent": _consent,
    "delegate": _job,
    "service": _service,
    "sleep": lambda answer: None,
    "child": lambda answer: answer,
    "recv": lambda answer: answer["message"],
    "child_result": _job,
}
"""How a recorded answer of each call kind becomes what the workflow receives."""


def _owner_answer(hop: RunContext) -> Any:
    """The JSON answer of the decided owner a resumed hop resumed from."""
    if hop.consent is not None:
        return {"status": hop.consent.status.value, "decided_by": hop.consent.decided_by}
    if hop.job is not None:
        return {"status": hop.job.status.value, "result": hop.job.result}
    if hop.receive_answer is not None:
        received = hop.receive_answer
        return {"received": received.received, "message": received.message, "message_id": received.message_id}
    if hop.attempt is not None:
        attempt = hop.attempt
        return {"attempt_id": attempt.attempt_id, "state": attempt.state.value,
                "result_refs": list(attempt.result_refs), "diagnostic_refs": list(attempt.diagnostic_refs),
                "usage": attempt.usage, "cost": attempt.cost}
    return None  # a timer


def _call_name(fn: Callable[..., Any]) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return str(getattr(fn, "__qualname__", None) or type(fn).__qualname__)


class WorkflowContext:
    """What a replayed workflow sees (``@app.workflow`` functions get one): its waits
    return their answers (see the module docstring). ``hop`` is the underlying
    :class:`RunContext` of this hop (``ctx.hop.request_consent(...)`` and the other
    park-and-return calls stay available, outside the replay)."""

    def __init__(self, hop: RunContext, *, starter: ChildStarter | None = None) -> None:
        self.hop = hop
        self._starter = starter
        self._position = 0
        self._resumed_at: tuple[int, str] | None = None
        if hop.resumed and hop.checkpoint is not None and isinstance(hop.checkpoint.state, dict):
            parked = hop.checkpoint.state.get(REPLAY_STATE)
            if isinstance(parked, dict) and type(parked.get("position")) is int and type(parked.get("call")) is str:
                self._resumed_at = (parked["position"], parked["call"])

    @property
    def run_id(self) -> str:
        return self.hop.run_id

    @property
    def resumed(self) -> bool:
        """Whether this hop resumed a wait (kept for workflows written before replay)."""
        return self.hop.resumed

    @property
    def position(self) -> int:
        """How many journaled calls the workflow made so far in this hop."""
        return self._position

    # --- the journal ----------------------------------------------------------------------

    async def _replayed(self, kind: str, label: str) -> tuple[int, str, bool, Any]:
        """Take the next position for the call ``kind:label``: ``(position, call, found,
        answer)``, ``found`` when the journal or the resumed wait answers it."""
        call = f"{kind}:{label}" if label else kind
        position = self._position
        self._position += 1
        journal, name = await self.hop.journal(), f"{JOURNAL_PREFIX}{position}"
        entry = journal.get(name)
        # The entry read as its call; one the context cannot read (not an object, no string
        # call) is the text its error shows, which no workflow asks for (specs/replay.md).
        recorded = None if entry is None else str(entry.get("call") if isinstance(entry, dict) else None)
        parked = None if self._resumed_at is None else replay.Parked(*self._resumed_at)
        verdict = replay.decide(replay.Situation(position=position, asked=call, recorded=recorded, parked=parked))
        if verdict.action is replay.Action.DIVERGED:
            raise WorkflowDiverged(verdict.position, verdict.held, verdict.asked)
        if verdict.action is replay.Action.ANSWER_RECORDED:
            return position, call, True, _DECODE[kind](journal[name]["answer"])
        if verdict.action is replay.Action.ANSWER_OWNER:
            answer = _owner_answer(self.hop)
            await self._record(position, call, answer)
            return position, call, True, _DECODE[kind](answer)
        return position, call, False, None  # replay.Action.RUN: the call runs for real

    async def _record(self, position: int, call: str, answer: Any) -> Any:
        entry = await self.hop.step(f"{JOURNAL_PREFIX}{position}", lambda: {"call": call, "answer": answer})
        return entry["answer"]

    @staticmethod
    def _parked_state(position: int, call: str) -> dict[str, Any]:
        return {REPLAY_STATE: {"position": position, "call": call}}

    # --- calls --------------------------------------------------------------------------

    async def step(self, fn: Callable[..., Any], *args: Any, name: str | None = None) -> Any:
        """``fn(*args)`` (a function or an ``async`` one) run once per Run: its JSON result
        is recorded at this position, and every later hop gets the recorded result without
        running ``fn``. ``name`` (default: the function's qualified name) is what the
        determinism check compares."""
        if not callable(fn):
            raise _refuse("fn", "callable_required")
        label = _call_name(fn) if name is None else name
        position, call, found, answer = await self._replayed("step", label)
        if found:
            return answer

        async def body() -> dict[str, Any]:
            value = fn(*args)
            if inspect.isawaitable(value):
                value = await value
            return {"call": call, "answer": value}

        # Through the hop's own step: it checks that the hop still holds its Run before
        # ``fn`` runs (a hop that lost it runs no step), then records under the fence.
        entry = await self.hop.step(f"{JOURNAL_PREFIX}{position}", body)
        return entry["answer"]

    async def consent(self, tool_name: str, payload: Any = None, *, tool_call_id: str | None = None,
                      preauthorized_by: str | None = None, expires_in_s: float | None = None) -> ConsentAnswer:
        """Ask for consent to one tool call and return the verdict. The first time the Run
        parks AWAITING_CONSENT (the hop ends); the verdict (or the deadline, with
        ``expires_in_s``) resumes it, and this call returns a :class:`ConsentAnswer`.
        ``tool_call_id`` defaults to the Run and this position."""
        position, call, found, answer = await self._replayed("consent", tool_name)
        if found:
            return answer  # type: ignore[no-any-return]
        await self.hop.request_consent(
            tool_name=tool_name, tool_call_id=tool_call_id or f"{self.run_id}@{position}", payload=payload,
            state=self._parked_state(position, call), preauthorized_by=preauthorized_by, expires_in_s=expires_in_s)

    async def delegate(self, runtime: str, profile: str, request: Any, *, request_id: str | None = None) -> JobAnswer:
        """Record a delegated job and return how it ended (:class:`JobAnswer`): the Run
        parks AWAITING_DELEGATE until its runner adopts the result and resumes it.
        ``request_id`` (the job's identity, unique across Runs) defaults to the Run and this
        position."""
        position, call, found, answer = await self._replayed("delegate", f"{runtime}/{profile}")
        if found:
            return answer  # type: ignore[no-any-return]
        await self.hop.delegate(request_id=request_id or f"{self.run_id}@{position}", runtime=runtime,
                                profile=profile, request=request, state=self._parked_state(position, call))

    async def call_service(self, runner: AttemptRunner, spec: AttemptSpec) -> ServiceAnswer:
        """Prepare and run a service attempt of this Run and return how it ended
        (:class:`ServiceAnswer`): the Run parks AWAITING_SERVICE while it runs, and an
        attempt the provider cannot settle yet is left to the relays (never failed, never
        sent twice)."""
        position, call, found, answer = await self._replayed("service", "")
        if found:
            return answer  # type: ignore[no-any-return]
        await self.hop.call_service(runner, spec, state=self._parked_state(position, call))

    async def sleep(self, seconds: float) -> None:
        """Park the Run on a durable timer ``seconds`` after the database clock (0 to 366
        days); returns once a later hop has woken from it."""
        await self._sleep(lambda hop, name, state: hop.sleep(seconds, state=state, name=name))

    async def sleep_until(self, when: dt.datetime) -> None:
        """Park the Run on a durable timer due at ``when`` (an aware datetime, compared with
        the database clock); returns once a later hop has woken from it."""
        await self._sleep(lambda hop, name, state: hop.sleep_until(when, state=state, name=name))

    async def recv(self, topic: str, *, timeout_s: float | None = None) -> Any:
        """The next message of ``topic`` sent to this Run (``app.send``, or
        ``RunLedger.messages.send`` from any process), in the order they were sent, each
        received once; None when ``timeout_s`` (more than 0, at most 366 days, on the
        database clock; None: wait as long as the Run lives) passed first. A message
        already there is taken at once; otherwise the Run parks AWAITING_MESSAGE until one
        is sent or the timeout passes. (A message that is itself None reads like a
        timeout: send an object.)"""
        position, call, found, answer = await self._replayed("recv", topic)
        if found:
            return answer
        # The receive's key is this position: asking again (a hop that runs again before
        # the answer was journaled) answers the same message, never a second one.
        received = await self.hop.receive(topic, key=f"{JOURNAL_PREFIX}{position}", timeout_s=timeout_s,
                                          state=self._parked_state(position, call))
        recorded = await self._record(position, call, {"received": received.received, "message": received.message,
                                                       "message_id": received.message_id})
        return recorded["message"]

    async def start_child(self, flow: Any, *args: Any, key: str | None = None, **kwargs: Any) -> ChildHandle:
        """Start a child Run of ``flow`` (an app workflow) with these arguments, once per
        position: its handle, whose :meth:`ChildHandle.result` waits for it. The child is
        admitted under ``key`` (default: the parent and this position, so a replay never
        starts a second one), inherits the parent's principal and scopes, and stands in
        the parent as a delegated job (runtime ``tenure:workflow``): the parent's
        cancellation is contained only once the child ended, and cancelling the parent
        through its handle cancels its running children first."""
        if self._starter is None:
            raise _refuse("flow", "app_workflow_required")
        name = getattr(flow, "name", None)
        if type(name) is not str:
            raise _refuse("flow", "app_workflow_required")
        position, call, found, answer = await self._replayed("child", name)
        if found:
            return ChildHandle(self, answer["run_id"], answer["job_id"], answer["request_id"], name, answer["request"])
        payload = flow.arguments(args, kwargs)
        request_id = f"{self.run_id}@{position}"
        request = {"workflow": name, "key": key if key is not None else f"child:{request_id}"}
        job = await self.hop.submit_job(request_id=request_id, runtime=CHILD_RUNTIME, profile=name, request=request)
        starter = self._starter
        # Both retried through database failures, as every call of the hop: admitting again
        # under the same key answers the same child Run, and advancing the job again with
        # the same identity answers False.
        run_id = await self.hop.retrying("child Run", lambda: starter(flow, payload, request["key"], self.hop.run))
        # The job records the child Run it stands for (once: a replay finds it recorded).
        await self.hop.retrying("delegated job", lambda: self.hop.ledger.jobs.advance(
            job.job_id, _ADMITTED, runtime_job_id=run_id))
        await self._record(position, call, {"run_id": run_id, "job_id": job.job_id, "request_id": request_id,
                                            "request": request})
        return ChildHandle(self, run_id, job.job_id, request_id, name, request)

    async def _sleep(self, park: Callable[[RunContext, str, Any], Awaitable[NoReturn]]) -> None:
        position, call, found, _answer = await self._replayed("sleep", "")
        if found:
            return
        await park(self.hop, f"sleep@{position}", self._parked_state(position, call))


class ChildHandle:
    """A child Run started by :meth:`WorkflowContext.start_child`: ``run_id`` and
    :meth:`result`."""

    def __init__(self, parent: WorkflowContext, run_id: str, job_id: str, request_id: str, name: str,
                 request: Any) -> None:
        self.parent = parent
        self.run_id = run_id
        self.job_id = job_id
        self._request_id = request_id
        self._name = name
        self._request = request

    def __repr__(self) -> str:
        return f"ChildHandle(run_id={self.run_id!r})"

    async def result(self) -> Any:
        """Wait for the child Run to end (the parent parks AWAITING_DELEGATE on the child's
        job until the child's end is adopted) and return what the child returned; raises
        :class:`ChildFailed` when it ended FAILED or CANCELLED."""
        parent = self.parent
        position, call, found, answer = await parent._replayed("child_result", self._name)
        if not found:
            await parent.hop.delegate(request_id=self._request_id, runtime=CHILD_RUNTIME, profile=self._name,
                                      request=self._request, state=parent._parked_state(position, call))
        adopted = answer.result if isinstance(answer.result, dict) else {}
        if not answer.ok:
            raise ChildFailed(answer.status, adopted.get("error"))
        return adopted.get("result")
