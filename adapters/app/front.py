"""One front door for tasks and workflows: :class:`App`.

::

    app = App("sqlite:///hello.db")

    @app.workflow()
    async def greet(ctx, name: str) -> dict:
        title = await ctx.step(str.title, name)          # recorded once per Run
        return {"greeting": f"hello, {title}"}

    async with app.launch():                              # a worker in this process
        handle = await greet.start("ada", key="greet-ada")
        print(await handle.result())                      # {'greeting': 'hello, Ada'}

``App`` is a :class:`~tenure.adapters.TaskApp` (``@app.task``, ``defer``, ``result``) that
also registers workflows. A workflow is an ``async def f(ctx, ...)``: ``ctx`` is a
:class:`~tenure.adapters.runs.replay.WorkflowContext`, whose waits return their answers
by replay (``verdict = await ctx.consent(...)``, ``await ctx.sleep(5)``), and the other
parameters are the arguments ``start`` binds.

``start`` admits a Run and publishes its first hop. With ``key``, admission is
replay-safe: the same key with the same arguments answers the same Run (a retried
request never starts a second one); the same key with other arguments, or for another
workflow, is refused (``RUN_ADMISSION_CONFLICT``), nothing written. Without a key every
call starts a new Run. The admission's other fields default to: ``principal="app"``,
``source="app"``, no session, no scopes (pass ``principal=``, ``scopes=``, ``session_id=``
to record who asked).

Workers: ``async with app.launch():`` serves this app's tasks and workflows in this
process (migrating the database first unless ``migrate=False``); ``tenure worker --app
module:app`` does the same as a process of its own, until SIGTERM. Every Run is held by
exactly one hop at a time, parks while it waits and is resumed only by the owner it waited
for (``docs/runs.md``); a process that dies leaves its Runs to the recovery of the next
worker to start, or of a live one once its node lease lapsed.

Timeouts: ``@app.workflow(timeout_s=...)`` or ``start(..., timeout_s=...)`` gives a Run a
deadline on the database clock, fixed at admission (part of the admitted work: a replay
with another timeout is refused). A Run not ended by then is cancelled by the relays of
any running worker, with proven containment (its running hop fenced, its children
cancelled by a parent's cancellation), and ends CANCELLED with ``error == "timeout"``
(``handle.result()`` raises :class:`WorkflowFailed`). It survives restarts: the deadline
is a column, and the first relay round after it passed acts on it.

Versions: a Run keeps the version it was admitted with, and a worker runs it only when it
registers that exact name and version (``workflow_unavailable`` otherwise). Under one
version, a changed body is checked by replay: a Run whose journal holds another call at a
position than the changed code asks for fails ``workflow_diverged``. An app workflow's pin
therefore carries no digest of its source (:data:`REPLAY_DIGEST`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from tenure.model import (
    TERMINAL_AGENT_JOB_STATUSES,
    TERMINAL_RUN_STATUSES,
    AgentJobRecord,
    ConfigValidationError,
    ConsentStatus,
    ErrorCode,
    MessageRecord,
    RunIntent,
    RunRecord,
    RunStatus,
    TenureError,
    WorkerConfig,
    bounds,
)
from tenure.model.validation import refuse

from ..queue.runner import WorkerStats
from ..queue.worker import Worker
from ..runs.ledger import RunLedger, resume_and_publish, run_id_for, timeout_us_of
from ..runs.queue_broker import QueueBroker
from ..runs.recovery import VISIT_CONCURRENCY, RecoveryPorts
from ..runs.replay import CHILD_RUNTIME, WorkflowContext, child_job_result
from ..runs.runtime import RunRuntime
from ..runs.worker import RunWorker
from ..runs.workflows import RunContext, Workflows
from ..tasks.app import TaskApp, TaskWorker, default_name, poll_until
from ..wiring.migrations import upgrade

__all__ = ["App", "Workflow", "WorkflowHandle", "WorkflowFailed", "AppWorker", "START_OPTIONS", "REPLAY_DIGEST",
           "DEFAULT_WORKFLOW_QUEUE"]

START_OPTIONS = frozenset({"key", "priority", "principal", "scopes", "session_id", "timeout_s"})
"""``start``'s own options: a workflow's parameters may not use these names."""

REPLAY_DIGEST = "replay"
"""The digest of an app workflow's pin: its body is checked by replay, not by its source."""

DEFAULT_WORKFLOW_QUEUE = "workflows"
MAX_WORKFLOW_NAME_CHARS = 100
MAX_VERSION_CHARS = 64
DEFAULT_PRINCIPAL = "app"
DEFAULT_SOURCE = "app"
DEFAULT_WORKFLOW_PRIORITY = 50
CHILD_JOB_STATUS = {RunStatus.DONE: "succeeded", RunStatus.FAILED: "failed", RunStatus.CANCELLED: "cancelled"}
"""The status a child Run's job adopts for each way the child Run ended."""
CHILDREN_RELAY_S = 1.0
"""How often an :class:`AppWorker` adopts ended children and resumes their parents."""

_refuse = functools.partial(refuse, reason="invalid_workflow")
log = logging.getLogger("tenure.app")


class WorkflowFailed(Exception):
    """``handle.result()`` of a Run that did not end DONE: ``status`` is ``failed`` or
    ``cancelled``, ``error`` the Run's stored error (``lost``, ``workflow_error:...``,
    ``workflow_diverged: ...``; None for an operator's cancel). The message names the
    status and the error, never the Run's payload."""

    def __init__(self, status: RunStatus, error: str | None) -> None:
        super().__init__(f"the workflow Run ended {status.value}" + (f": {error}" if error else ""))
        self.status = status
        self.error = error


class WorkflowHandle:
    """A started Run of an app workflow: ``run_id``, and :meth:`status`, :meth:`result`,
    :meth:`cancel`. ``app.handle(run_id)`` makes one for a Run started elsewhere."""

    def __init__(self, app: App, run_id: str) -> None:
        self.app = app
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"WorkflowHandle(run_id={self.run_id!r})"

    async def status(self) -> RunRecord | None:
        """The Run as stored now (its ``status``, ``result``, ``error``, the owner it waits
        for); None when no Run has this ID."""
        return await self.app.ledger.get(self.run_id)

    async def result(self, *, wait_s: float = 60.0) -> Any:
        """Wait up to ``wait_s`` seconds (0 to 3,600) for the Run to end and return what
        its workflow returned. Raises :class:`WorkflowFailed` when it ended FAILED or
        CANCELLED, ``TimeoutError`` when it has not ended by then (it goes on), and
        ``ConfigValidationError`` (``unknown_run``) when no Run has this ID."""
        run = await poll_until(self.status, lambda run: run is None or run.status in TERMINAL_RUN_STATUSES, wait_s)
        if run is None:
            raise ConfigValidationError("unknown_run", fields=("run_id",), problems=("not_found",))
        if run.status is RunStatus.DONE:
            return run.result
        if run.status in TERMINAL_RUN_STATUSES:
            raise WorkflowFailed(run.status, run.error)
        raise TimeoutError("the workflow Run has not ended yet")

    async def cancel(self) -> bool:
        """Cancel the Run: elect the cancellation (its running hop is fenced, its waits
        are voided) and finish it once containment is proven (``docs/runs.md``). True
        when this call cancelled it or elected a cancellation the relays finish (an
        effect not contained yet: a delegated job still running, a service attempt
        unsettled, a child that could not be cancelled yet); False when the Run had
        already ended DONE or FAILED. A child Run (``ctx.start_child``) still running is
        cancelled first, the same way."""
        return await self._cancel(None)

    async def _cancel(self, jobs: Sequence[AgentJobRecord] | None) -> bool:
        """:meth:`cancel`, containing ``jobs``: the Run's open (or LOST) jobs as its caller
        just listed them (None: listed here, once the cancellation is elected)."""
        ledger = self.app.ledger
        ticket = await ledger.begin_cancel(self.run_id)
        if ticket is None:
            return False
        # Its running children first: each is cancelled the same way, and its job in this
        # Run recorded CANCELLED once the child ended (the containment finish_cancel asks).
        for job in await ledger.jobs.list(self.run_id) if jobs is None else jobs:
            await self.app.contain_child(job)
        try:
            await ledger.finish_cancel(ticket.run_id, ticket.enqueue_seq, self.app.broker)
        except TenureError as error:
            if error.code is not ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                raise
        return True


class Workflow:
    """An app workflow: ``start(...)`` admits a Run of it (see :class:`App`)."""

    def __init__(self, app: App, function: Callable[..., Awaitable[Any]], *, name: str, version: str, queue: str,
                 priority: int, timeout_s: float | None = None) -> None:
        self.app = app
        self.timeout_s = timeout_s
        """The timeout every Run of it gets unless ``start`` names another (None: none)."""
        self.function = function
        self.name = name
        self.version = version
        self.queue = queue
        self.priority = priority
        self.signature = inspect.signature(function)
        self._parameters = inspect.Signature(list(self.signature.parameters.values())[1:])

    def __repr__(self) -> str:
        return f"Workflow(name={self.name!r}, version={self.version!r})"

    def arguments(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """The Run's payload: ``args`` and ``kwargs`` bound to the workflow's parameters, as a
        JSON object by parameter name (``invalid_workflow_arguments`` naming the problem)."""
        try:
            bound = self._parameters.bind(*args, **kwargs)
        except TypeError:
            raise refuse("args", "arguments_do_not_match_parameters", reason="invalid_workflow_arguments") from None
        return dict(bound.arguments)

    async def run(self, hop: RunContext) -> Any:
        """One hop of a Run of this workflow (what the Run worker calls)."""
        payload = hop.payload if isinstance(hop.payload, dict) else {}
        bound = inspect.BoundArguments(self._parameters, dict(payload))
        return await self.function(WorkflowContext(hop, starter=self.app.start_child_run), *bound.args,
                                   **bound.kwargs)

    async def start(self, *args: Any, key: str | None = None, priority: int | None = None,
                    principal: str = DEFAULT_PRINCIPAL, scopes: Iterable[str] = (), session_id: str | None = None,
                    timeout_s: float | None = None, **kwargs: Any) -> WorkflowHandle:
        """Admit a Run of this workflow with these arguments and publish its first hop;
        its handle. See :class:`App` for ``key`` and the admission's fields; ``timeout_s``
        (default: the workflow's own) cancels a Run not ended by then (see :class:`App`)."""
        payload = self.arguments(args, kwargs)
        return await self.app.start_run(self, payload, key=key, priority=priority, principal=principal,
                                        scopes=scopes, session_id=session_id,
                                        timeout_s=self.timeout_s if timeout_s is None else timeout_s)


class AppWorker:
    """Serves one app's tasks (a fenced :class:`~tenure.adapters.Worker`) and workflows
    (a :class:`~tenure.adapters.RunRuntime` with one :class:`~tenure.adapters.RunWorker`
    on the app's :class:`~tenure.adapters.QueueBroker`) in this process:
    ``async with worker:`` runs both until the block ends, :meth:`run` until ``stop`` is
    set. ``node`` names this process in the node leases (default: the task worker's
    ``worker_id`` when given, else host and PID): a process started again under the same
    node reconciles what its last incarnation left at once, where another node waits for
    that node's lease to lapse first."""

    def __init__(self, app: App, *, node: str | None = None, run_concurrency: int = 4,
                 queues: Sequence[str] | None = None, **task_settings: Any) -> None:
        self.app = app
        if node is None:
            given = task_settings.get("worker_id")
            node = given if given is not None else f"{socket.gethostname()[:100]}:{os.getpid()}"
        self.node = node
        self.tasks: TaskWorker | None = app.task_worker(queues=queues, **task_settings) if app.tasks else None
        self.runs: RunWorker | None = None
        self.runtime: RunRuntime | None = None
        if app.workflows:
            self.runs = RunWorker(app.ledger, app.broker, app.registry, node=self.node, concurrency=run_concurrency,
                                  queues=app.workflow_queues)
            ledger = app.ledger
            # The runtime's default ports, and the containment of child Runs (a parent's
            # cancellation that startup reconciliation finishes cancels its children).
            ports = RecoveryPorts(broker=app.broker, checkpoint_owner=ledger.checkpoints.owner,
                                  delete_checkpoint=ledger.checkpoints.delete,
                                  known_queues=frozenset(app.workflow_queues),
                                  checkpoint_outcome=ledger.checkpoints.outcome, contain_job=app.contain_child,
                                  concurrency=VISIT_CONCURRENCY)
            self.runtime = RunRuntime(ledger, brokers=[app.broker], workers=[self.runs], node=self.node, ports=ports)
        if self.tasks is None and self.runtime is None:
            raise refuse("app", "no_tasks_or_workflows_registered", reason="invalid_worker")
        self._stop = asyncio.Event()
        self._serving: asyncio.Task[WorkerStats] | None = None
        self._children: asyncio.Task[None] | None = None

    @property
    def stats(self) -> WorkerStats | None:
        """The task worker's counts (None without tasks); the Run worker's are in
        ``self.runs.outcomes``."""
        return None if self.tasks is None else self.tasks.stats

    async def __aenter__(self) -> AppWorker:
        if self.runtime is not None:
            await self.runtime.__aenter__()  # startup reconciliation, relays, the Run worker
            self._children = asyncio.ensure_future(self._relay_children())
        if self.tasks is not None:
            serving = self._serving = asyncio.ensure_future(self.tasks.run(self._stop))
            # The app's on_worker_start hooks run first: one that raises fails this entry,
            # not the exit of a block that ran meanwhile.
            ran = asyncio.ensure_future(self.tasks.hooks_ran.wait())
            try:
                await asyncio.wait({serving, ran}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                ran.cancel()
            if serving.done() and not serving.cancelled() and serving.exception() is not None:
                failure = serving.exception()
                self._serving = None
                await self.__aexit__(None, None, None)
                assert failure is not None
                raise failure
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._stop.set()
        try:
            if self._children is not None:
                await self._children
            if self._serving is not None:
                await self._serving
        finally:
            if self.runtime is not None:
                await self.runtime.__aexit__(*exc_info)

    async def _relay_children(self) -> None:
        """Adopt ended child Runs and resume their parents, once per :data:`CHILDREN_RELAY_S`
        until the worker stops (a round that meets a database failure is tried again)."""
        while not self._stop.is_set():
            try:
                await self.app.settle_children()
            except TenureError as error:
                log.warning("the children relay met a database failure (%s); trying again", error.reason)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._stop.wait(), CHILDREN_RELAY_S)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (or this task is cancelled), then shut down: the task
        worker finishes what is in flight within its grace, and the Run runtime proves every
        hop ended."""
        waiting = stop if stop is not None else asyncio.Event()
        async with self:
            # Until ``stop``, or until the task worker ended by itself (it failed): then
            # the exit re-raises its failure at once instead of serving nothing until a
            # signal comes.
            stopped = asyncio.ensure_future(waiting.wait())
            try:
                await asyncio.wait([stopped, *([self._serving] if self._serving is not None else [])],
                                   return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()


class App(TaskApp):
    """Tasks and workflows of one application on one database (``db_url``: ``sqlite:///path``
    or ``postgresql://...``). See the module docstring."""

    def __init__(self, db_url: str, *, config: WorkerConfig | None = None) -> None:
        super().__init__(db_url, config=config)
        self.registry = Workflows()
        """The low-level registry the Run worker resolves pins in."""
        self._workflows: dict[str, Workflow] = {}
        self._ledger: RunLedger | None = None
        self._broker: QueueBroker | None = None

    def on(self, db_url: str, config: WorkerConfig | None = None) -> App:
        """This app's tasks and workflows on another database (see :meth:`TaskApp.on`)."""
        other = super().on(db_url, config)  # a copy without connections: copy_for_another_loop
        assert isinstance(other, App)
        return other

    def copy_for_another_loop(self) -> App:
        """This app without connections (see :meth:`TaskApp.copy_for_another_loop`)."""
        other = super().copy_for_another_loop()
        assert isinstance(other, App)
        other._ledger = other._broker = None  # its own, on its loop (the sync client's) or database (on)
        return other

    # --- registering -------------------------------------------------------------------

    def workflow(self, function: Callable[..., Awaitable[Any]] | None = None, *, name: str | None = None,
                 version: str = "1", queue: str = DEFAULT_WORKFLOW_QUEUE, priority: int = DEFAULT_WORKFLOW_PRIORITY,
                 on_lost: str = "fail", max_hop_retries: int | None = None, timeout_s: float | None = None) -> Any:
        """Register ``async def f(ctx, ...)`` as a workflow (``@app.workflow`` or
        ``@app.workflow(...)``). ``name`` defaults to ``module.qualname`` (as for tasks);
        ``version`` (default ``"1"``) is kept by every Run admitted under it; ``queue`` and
        ``priority`` (0..100) route its hops; ``on_lost``/``max_hop_retries`` as
        :meth:`Workflows.register` (``"retry"``: a hop lost with its process runs again,
        replaying its journal); ``timeout_s`` (more than 0, at most 366 days) the timeout of
        every Run of it that ``start`` does not give another."""
        def register(target: Callable[..., Awaitable[Any]]) -> Workflow:
            return self._register_workflow(target, name=name, version=version, queue=queue, priority=priority,
                                           on_lost=on_lost, max_hop_retries=max_hop_retries, timeout_s=timeout_s)

        return register if function is None else register(function)

    def _register_workflow(self, function: Callable[..., Awaitable[Any]], *, name: str | None, version: str,
                           queue: str, priority: int, on_lost: str, max_hop_retries: int | None,
                           timeout_s: float | None) -> Workflow:
        if not inspect.iscoroutinefunction(function):
            raise _refuse("function", "async_function_required")
        parameters = list(inspect.signature(function).parameters.values())
        if not parameters or parameters[0].kind not in (inspect.Parameter.POSITIONAL_ONLY,
                                                        inspect.Parameter.POSITIONAL_OR_KEYWORD):
            raise _refuse("function", "context_parameter_required")
        if any(parameter.name in START_OPTIONS for parameter in parameters[1:]):
            raise _refuse("function", "reserved_argument_name")
        chosen = name if name is not None else default_name(function)
        if not bounds.is_bounded_text(chosen, MAX_WORKFLOW_NAME_CHARS):
            raise _refuse("name", "text_of_at_most_100_characters_required")
        if not bounds.is_bounded_text(version, MAX_VERSION_CHARS):
            raise _refuse("version", "text_of_at_most_64_characters_required")
        if not bounds.is_bounded_text(queue, 50):
            raise _refuse("queue", "text_required")
        if not bounds.is_strict_int(priority) or not 0 <= priority <= 100:
            raise _refuse("priority", "integer_out_of_range")
        if chosen in self._workflows:
            raise _refuse("name", "workflow_registered")
        timeout_us_of(timeout_s)  # refused here (ConfigValidationError) rather than at every start
        flow = Workflow(self, function, name=chosen, version=version, queue=queue, priority=priority,
                        timeout_s=timeout_s)
        self.registry.register(chosen, version, flow.run, digest=REPLAY_DIGEST, on_lost=on_lost,
                               max_hop_retries=max_hop_retries)
        self._workflows[chosen] = flow
        return flow

    @property
    def workflows(self) -> Mapping[str, Workflow]:
        """The registered workflows by name."""
        return dict(self._workflows)

    @property
    def workflow_queues(self) -> list[str]:
        """The Run queues of the registered workflows, in registration order."""
        return list(dict.fromkeys(flow.queue for flow in self._workflows.values()))

    def get_workflow(self, name: object) -> Workflow:
        """The workflow registered under ``name``; ``unknown_workflow`` otherwise."""
        flow = self._workflows.get(name) if type(name) is str else None
        if flow is None:
            raise ConfigValidationError("unknown_workflow", fields=("workflow",), problems=("not_registered",))
        return flow

    # --- the Run side ------------------------------------------------------------------

    @property
    def ledger(self) -> RunLedger:
        """The Run ledger this app admits and reads Runs through (opened on first use)."""
        if self._ledger is None:
            self._ledger = RunLedger(self.db_url, timeout_seconds=self.config.timeout_seconds,
                                     db_schema=self.config.db_schema)
        return self._ledger

    @property
    def broker(self) -> QueueBroker:
        """The broker this app's Run hops go through: tenure's own task table in the same
        database (no broker service), serving every workflow queue of the app."""
        if self._broker is None:
            if not self._workflows:
                raise refuse("app", "no_workflows_registered", reason="invalid_worker")
            self._broker = QueueBroker(self.db_url, queues=self.workflow_queues)
        return self._broker

    async def start_run(self, flow: Workflow, payload: dict[str, Any], *, key: str | None, priority: int | None,
                        principal: str, scopes: Iterable[str], session_id: str | None,
                        timeout_s: float | None = None) -> WorkflowHandle:
        """Admit and publish a Run of ``flow`` with ``payload`` (its bound arguments);
        what :meth:`Workflow.start` calls."""
        if isinstance(scopes, str) or not isinstance(scopes, Iterable):
            raise refuse("scopes", "scope_names_required", reason="invalid_workflow_arguments")
        intent = RunIntent(session_id, DEFAULT_SOURCE, principal, frozenset(scopes), payload)
        pin = self.registry.pin(flow.name, flow.version)
        admission = await self.ledger.admit(intent, workflow=pin, queue=flow.queue,
                                            priority=flow.priority if priority is None else priority,
                                            idempotency_key=key, timeout_s=timeout_s)
        run_id = admission.run.run_id
        with contextlib.suppress(TenureError):
            # Publishing again is safe (the hop key is the same); a broker failure leaves
            # the delivery PENDING for the relays of any running worker to publish.
            await self.ledger.publish(run_id, 0, self.broker)
        return WorkflowHandle(self, run_id)

    async def start_child_run(self, flow: Any, payload: Mapping[str, Any], key: str, parent: RunRecord) -> str:
        """Admit and publish a child Run of ``flow`` for the Run ``parent`` (the starter a
        replayed workflow's ``start_child`` calls): the workflow registered under the same
        name in this app, under ``key``, with the parent's principal and scopes."""
        registered = self.get_workflow(getattr(flow, "name", None))
        handle = await self.start_run(registered, dict(payload), key=key, priority=None, principal=parent.principal,
                                      scopes=parent.scopes, session_id=None, timeout_s=registered.timeout_s)
        return handle.run_id

    async def adopt_child(self, job: AgentJobRecord) -> bool:
        """Adopt a child Run's end into the delegated job that stands for it in its parent:
        True once the job ended (now or before), False while the child runs."""
        if job.runtime != CHILD_RUNTIME or job.runtime_job_id is None:
            return False
        if job.status in TERMINAL_AGENT_JOB_STATUSES:
            return True
        child = await self.ledger.get(job.runtime_job_id)
        if child is None or child.status not in TERMINAL_RUN_STATUSES:
            return False
        adopted = child_job_result(job.job_id, CHILD_JOB_STATUS[child.status], child.result, child.error)
        await self.ledger.jobs.adopt_result(job.job_id, adopted)  # False: another process adopted it first
        return True

    async def contain_child(self, job: AgentJobRecord) -> bool:
        """Recovery's ``contain_job`` for a child Run's job: cancel the child (and its own
        children) and answer True once it ended, after adopting its end into the job (its
        true end: a child that finished before the cancel reached it is recorded with
        its result, not as cancelled). A job of another runtime is not this app's to
        contain. Recovery asks this only before terminal truth (a cancellation, a Run
        failed ``lost``): a hop that runs again keeps its jobs and adopts them.

        A job whose child was never recorded on it (the hop that started the child ended
        between the job's submission and that record: killed, frozen, fenced) names its
        child by the admission key its request holds, so the child is found and contained
        all the same; when no Run was admitted under that key, nothing was started and the
        job is recorded CANCELLED. (An admission that its dead hop still had in flight and
        that commits after this is a child nobody waits for: it runs to its end, unadopted.)"""
        if job.runtime != CHILD_RUNTIME:
            return False
        child_id = job.runtime_job_id or self._unrecorded_child(job)
        if child_id is None:
            return False
        if job.runtime_job_id is None and await self.ledger.get(child_id) is None:
            await self.ledger.jobs.record_cancelled(job.job_id)  # no child was admitted: nothing started
            return True
        await self.handle(child_id).cancel()
        child = await self.ledger.get(child_id)
        if child is None or child.status not in TERMINAL_RUN_STATUSES:
            return False
        ended = child_job_result(job.job_id, CHILD_JOB_STATUS[child.status], child.result, child.error)
        await self.ledger.jobs.adopt_result(job.job_id, ended)  # False when its end was adopted already
        return True

    @staticmethod
    def _unrecorded_child(job: AgentJobRecord) -> str | None:
        """The child Run ID a child job's request names by its admission key (None: no key)."""
        key = job.request.get("key") if type(job.request) is dict else None
        return run_id_for(key) if type(key) is str and key else None

    async def settle_children(self, *, limit: int = 256) -> int:
        """One round of the children relay: every Run waiting on a child Run's job whose
        child ended gets that end adopted and is resumed; every cancelling Run (an
        operator's cancel finished later, a timeout the relays elected) gets its running
        children cancelled and its cancellation finished once they ended. How many Runs it
        resumed or cancelled. Every :class:`AppWorker` runs one round per relay interval."""
        moved = 0
        async for parent in self._runs_of(RunStatus.AWAITING_DELEGATE, limit):
            job = None if parent.owner_id is None else await self.ledger.jobs.get(parent.owner_id)
            if job is not None and job.runtime == CHILD_RUNTIME and await self.adopt_child(job):
                with contextlib.suppress(TenureError):
                    if await resume_and_publish(self.ledger, self.broker, parent.run_id,
                                                owner_id=job.job_id) is not None:
                        moved += 1
        async for parent in self._runs_of(RunStatus.CANCELLING, limit):
            jobs = await self.ledger.jobs.list(parent.run_id)
            if any(job.runtime == CHILD_RUNTIME for job in jobs) and await self.handle(parent.run_id)._cancel(jobs):
                moved += 1
        return moved

    async def _runs_of(self, status: RunStatus, limit: int) -> AsyncIterator[RunRecord]:
        """The Runs of ``status``, oldest first, at most ``limit`` of them."""
        after: str | None = None
        while limit > 0:
            page = await self.ledger.list_runs(status=status, after=after, limit=min(limit, 64))
            for run in page.items:
                yield run
            limit -= len(page.items)
            if page.next_cursor is None:
                return
            after = page.next_cursor

    async def send(self, run_id: str, topic: str, message: Any, *, message_id: str | None = None) -> MessageRecord:
        """Send ``message`` (any JSON value up to 1 MiB) to the Run ``run_id`` under ``topic``,
        from any process: a workflow waiting in ``ctx.recv(topic)`` gets it and its Run
        resumes; otherwise it is kept for the Run's next receive of that topic (delivered
        once, in the order sent). ``message_id`` (default: a fresh one) makes the send
        replay-safe: the same ID with the same topic and message answers the stored message
        and sends nothing twice; another topic or message under it raises
        ``RUN_MESSAGE_CONFLICT``. A Run that is unknown, finished or being cancelled
        refuses it (``RUN_MESSAGE_REFUSED``); nothing is stored then."""
        broker = self.broker if self._workflows else None  # else the relays publish the resumed hop
        return await self.ledger.messages.send(run_id, topic, message, message_id=message_id, broker=broker)

    def handle(self, run_id: str) -> WorkflowHandle:
        """The handle of a Run started elsewhere (by its ID, or ``key_run_id(key)``)."""
        if not bounds.is_bounded_text(run_id, 64):
            raise refuse("run_id", "text_required", reason="invalid_run_id")
        return WorkflowHandle(self, run_id)

    @staticmethod
    def key_run_id(key: str) -> str:
        """The Run ID a start under ``key`` gets (from any process)."""
        return run_id_for(key)

    async def decide_consent(self, consent_id: str, *, granted: bool, decided_by: str) -> bool:
        """Grant or deny a consent a Run waits for, and resume the Run at once (the relays
        would, within a round): True when this verdict was the first."""
        if type(granted) is not bool:
            raise refuse("granted", "bool_required", reason="invalid_consent")
        verdict = ConsentStatus.GRANTED if granted else ConsentStatus.DENIED
        consents = self.ledger.consents
        if not await consents.decide(consent_id, verdict, decided_by=decided_by):
            return False
        consent = await consents.get(consent_id)
        if consent is not None:
            with contextlib.suppress(TenureError):
                await resume_and_publish(self.ledger, self.broker, consent.run_id, owner_id=consent_id)
        return True

    # --- running -----------------------------------------------------------------------

    def task_worker(self, *, queues: Sequence[str] | None = None, **settings: Any) -> TaskWorker:
        """The fenced task :class:`Worker` alone (:meth:`TaskApp.worker`)."""
        return super().worker(queues=queues, **settings)

    def worker(self, *, queues: Sequence[str] | None = None, **settings: Any) -> AppWorker:  # type: ignore[override]
        """An :class:`AppWorker` serving this app's tasks and workflows (``node``,
        ``run_concurrency``; the task Worker's settings otherwise)."""
        return AppWorker(self, queues=queues, **settings)

    @contextlib.asynccontextmanager
    async def launch(self, *, migrate: bool = True, **settings: Any) -> AsyncIterator[AppWorker]:
        """Serve this app's tasks and workflows in this process for the ``async with``
        block (:meth:`worker`'s settings), migrating the database first unless
        ``migrate=False`` (:func:`~tenure.adapters.upgrade`: safe to repeat)."""
        if type(migrate) is not bool:
            raise refuse("migrate", "bool_required", reason="invalid_worker")
        if migrate:
            await upgrade(self.db_url, schema=self.config.db_schema)
        async with self.worker(**settings) as worker:
            yield worker

    async def close(self) -> None:
        await super().close()
        if self._broker is not None:
            await self._broker.close()
            self._broker = None
        if self._ledger is not None:
            await self._ledger.close()
            self._ledger = None

