"""``tenure runs``: run workflow Runs and operate on them.

    tenure runs worker  --db URL --broker saq|queue --workflows package.module:registry [--node NAME]
    tenure runs admit   --db URL --workflows package.module:registry --workflow NAME --revision REV
                        [--payload JSON] [--queue runs] [--priority 50] [--key KEY] [--broker saq]
                        [--timeout-seconds S]
    tenure runs list    --db URL [--status STATUS] [--limit N]
    tenure runs show    --db URL RUN_ID [--result]
    tenure runs retry   --db URL RUN_ID [--broker saq]
    tenure runs cancel  --db URL RUN_ID [--broker saq]
    tenure runs consent --db URL CONSENT_ID grant|deny|expire --by PRINCIPAL [--broker saq]

``worker`` runs a :class:`~tenure.adapters.RunRuntime` (startup reconciliation, relays
and one :class:`~tenure.adapters.RunWorker`) until SIGTERM or SIGINT; the broker is SAQ
on PostgreSQL (``--saq-dsn``, default the ``--db`` URL) or tenure's owned queue in the
``--db`` database (``queue``: no broker service, SQLite too). The operator commands work
without a broker: what they leave to publish (an admission, a resumed Run) is published
by the relays of any running worker; ``cancel`` elects the cancellation and, given a
broker, fences the hop and finishes it (otherwise the next startup reconciliation
does); ``retry`` re-admits a Run that failed ``lost`` as a new Run linked to it; ``show``
of a Run parked on a consent prints the consent's status and deadline (the relays expire
it once the deadline passed). Output is a plain table; nothing printed echoes a payload
or a result (``show --result`` prints a DONE Run's result when asked).

Exit status: 0 on success; 2 for bad arguments, a refused request, or a database that
was never migrated (checked before the action does anything, as ``tenure worker`` does);
1 for a database or broker failure, a degraded PostgreSQL startup, or a shutdown that
could not prove every hop ended.
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
import signal
import socket
import sys
from collections.abc import Sequence
from typing import Any

from tenure.model import (
    ConfigValidationError,
    ConsentStatus,
    ErrorCode,
    JsonProblem,
    RunIntent,
    RunStatus,
    TenureError,
    WaitKind,
    canonical_json,
    load_json,
)

from tenure.adapters.core.text import clean_text
from tenure.adapters.runs import (
    QueueBroker,
    RunLedger,
    RunRuntime,
    RunWorker,
    SaqBroker,
    ShutdownIncomplete,
    StartupDegraded,
    Workflows,
)
from tenure.adapters.runs.workflows import resume_and_publish
from .logs import add_logging_options, configure_logging
from .metrics import add_metrics_options, start_metrics
from .reporting import RefusedWithDetail
from .worker_cli import import_problem, refused_unless_migrated

__all__ = ["add_runs_parser", "run_runs", "run_table"]

_PROBE_RUN_ID = "00000000-0000-0000-0000-000000000000"

VERDICTS = {"grant": ConsentStatus.GRANTED, "deny": ConsentStatus.DENIED, "expire": ConsentStatus.EXPIRED}


def add_runs_parser(commands: Any) -> None:
    runs = commands.add_parser("runs", help="run workflow Runs (worker) and operate on them")
    actions = runs.add_subparsers(dest="action", required=True)

    def with_db(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        parser.add_argument("--db", help="database URL (already migrated: see `tenure migrate`; "
                                          "default: $TENURE_DB)")
        parser.set_defaults(database_required=True)
        return parser

    def with_broker(parser: argparse.ArgumentParser, *, required: bool) -> None:
        parser.add_argument("--broker", choices=["saq", "queue"], required=required,
                            help="the broker hops are delivered through: saq (SAQ on PostgreSQL) or queue "
                                 "(tenure's owned queue in the --db database, SQLite or PostgreSQL)")
        parser.add_argument("--saq-dsn", help="SAQ's PostgreSQL URL (default: the --db URL)")
        parser.add_argument("--queue", dest="queues", action="append",
                            help="a Run queue to serve or publish to (repeatable; default: runs)")

    worker = with_db(actions.add_parser("worker", help="run Runs until SIGTERM or SIGINT"))
    with_broker(worker, required=True)
    worker.add_argument("--workflows", required=True, help="the Workflows registry, as package.module:name")
    worker.add_argument("--node", help="this node's name (default: the host name)")
    worker.add_argument("--concurrency", type=int, default=4, help="hops in flight per queue (default 4)")
    worker.add_argument("--shutdown-seconds", type=float, default=30.0, help="shutdown deadline (default 30)")
    worker.add_argument("--relay-seconds", type=float, default=1.0,
                        help="how often the relays publish, resume due timers and decided waits (default 1)")
    worker.add_argument("--node-lease-seconds", type=float, default=30.0,
                        help="this node's lease: another node takes its Runs over once it lapses; more than two "
                             "relay intervals (default 30)")
    add_logging_options(worker)
    add_metrics_options(worker)

    admit = with_db(actions.add_parser("admit", help="admit a Run (published now with --broker, else by a relay)"))
    with_broker(admit, required=False)
    admit.add_argument("--workflows", required=True, help="the Workflows registry, as package.module:name")
    admit.add_argument("--workflow", required=True, help="the workflow's registered name")
    admit.add_argument("--revision", required=True, help="the workflow's registered revision")
    payload = admit.add_mutually_exclusive_group()
    payload.add_argument("--payload", default="{}",
                         help="the intent's payload, as JSON (default {}); - reads it from stdin")
    payload.add_argument("--payload-file", help="read the intent's payload, as JSON, from this file")
    admit.add_argument("--priority", type=int, default=50, help="0 to 100, higher first (default 50)")
    admit.add_argument("--key", help="an idempotency key (a repeat returns the same Run)")
    admit.add_argument("--principal", default="operator", help="who asks (default operator)")
    admit.add_argument("--timeout-seconds", type=float, dest="timeout_s",
                       help="cancel the Run (reason timeout) if it has not ended this many seconds after its "
                            "admission, on the database clock (more than 0, at most 366 days; default: none)")

    listing = with_db(actions.add_parser("list", help="list Runs, oldest first"))
    listing.add_argument("--status", type=str.lower, choices=[status.value for status in RunStatus],
                         help="only Runs of this status (any letter case)")
    listing.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")

    show = with_db(actions.add_parser("show", help="one Run and its current delivery"))
    show.add_argument("run_id")
    show.add_argument("--result", action="store_true",
                      help="also print a DONE Run's result as JSON (never printed otherwise: it may carry data)")
    show.add_argument("--show-payload", action="store_true",
                      help="also print the payload of the consent the Run waits on, as JSON (never printed "
                           "otherwise: it is what the approver approves, and may carry data)")

    retry = with_db(actions.add_parser("retry", help="re-admit a Run that failed lost as a new Run linked to it"))
    with_broker(retry, required=False)
    retry.add_argument("run_id")

    cancel = with_db(actions.add_parser("cancel", help="cancel a Run (finished now with --broker)"))
    with_broker(cancel, required=False)
    cancel.add_argument("run_id")

    consent = with_db(actions.add_parser("consent", help="decide a consent and resume its Run"))
    with_broker(consent, required=False)
    consent.add_argument("consent_id")
    consent.add_argument("verdict", type=str.lower, choices=sorted(VERDICTS))
    consent.add_argument("--by", required=True, help="the deciding principal")


def run_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain left-aligned table (every cell as text; empty cells as ``-``)."""
    cells = [[("-" if value is None else str(value)) for value in row] for row in rows]
    # A list, not unpacked arguments: with no rows ``max`` would get the header's width alone.
    widths = [max([len(header), *(len(row[i]) for row in cells)]) for i, header in enumerate(headers)]
    lines = ["  ".join(header.ljust(widths[i]) for i, header in enumerate(headers)).rstrip()]
    lines += ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines)


def _when(value: Any) -> str | None:
    return None if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _registry(path: str) -> Workflows:
    if sys.path[0] != "":
        sys.path.insert(0, "")  # the registry's package may live in the current folder
    registry, problem = import_problem(path, "registry")
    if problem is not None:
        raise RefusedWithDetail("invalid_workflows", fields=("workflows",), problems=("does_not_import",),
                                detail=problem)
    if not isinstance(registry, Workflows):
        raise ConfigValidationError("invalid_workflows", fields=("workflows",), problems=("workflows_required",))
    return registry


class _Closing:
    """A broker as an async context (SaqBroker connects; QueueBroker only closes)."""

    def __init__(self, broker: Any) -> None:
        self.broker = broker

    async def __aenter__(self) -> Any:
        connect = getattr(self.broker, "connect", None)
        if connect is not None:
            await connect()
        return self.broker

    async def __aexit__(self, *exc_info: object) -> None:
        await self.broker.disconnect()


def _broker(arguments: argparse.Namespace) -> Any:
    kind = getattr(arguments, "broker", None)
    queues = arguments.queues or ["runs"]
    if kind is None:
        return None
    if kind == "queue":
        return QueueBroker(arguments.db, queues=queues)
    return SaqBroker(arguments.saq_dsn or arguments.db, queues=queues)


async def _worker(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    configure_logging(arguments.log_level, arguments.log_format)
    workflows = _registry(arguments.workflows)
    broker = _broker(arguments)
    assert broker is not None
    node = arguments.node or socket.gethostname()
    metrics = start_metrics(arguments, arguments.db, ledger=ledger)  # /metrics and spans, when asked for
    worker = RunWorker(ledger, broker, workflows, node=node, concurrency=arguments.concurrency,
                       queues=arguments.queues or ["runs"], metrics=metrics)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        runtime = RunRuntime(ledger, brokers=[broker], workers=[worker], node=node,
                             shutdown_deadline_s=arguments.shutdown_seconds, relay_interval_s=arguments.relay_seconds,
                             node_lease_s=arguments.node_lease_seconds)
        if metrics is not None:
            metrics.watch_runtime(runtime)
        async with runtime:
            report = runtime.startup
            assert report is not None
            counts = ", ".join(f"{name} {count}" for name, count in report.counts.items() if count)
            print(f"runs worker {node}: {len(workflows)} workflow(s), queues {', '.join(sorted(worker.queues))}; "
                  f"startup: {counts or 'nothing to repair'}" + (" (degraded)" if report.degraded else ""), flush=True)
            await stop.wait()
    except StartupDegraded as error:
        print(f"failed: {error}")
        return 1
    except ShutdownIncomplete as error:
        print(f"failed: {error}")
        return 1
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    outcomes = ", ".join(f"{name} {count}" for name, count in worker.outcomes.items())
    print(f"stopped: {outcomes}", flush=True)
    return 0


async def _admit(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    workflows = _registry(arguments.workflows)
    text, field = _payload_text(arguments)
    try:
        # load_json bounds the nesting: json.loads would raise RecursionError on '[' * 5000.
        payload = load_json(text)
    except JsonProblem as problem:
        raise ConfigValidationError("invalid_payload", fields=(field,), problems=(problem.code,)) from None
    queue = (arguments.queues or ["runs"])[0]
    intent = RunIntent(None, "cli", arguments.principal, frozenset(), payload)
    admission = await ledger.admit(intent, workflow=workflows.pin(arguments.workflow, arguments.revision),
                                   queue=queue, priority=arguments.priority, idempotency_key=arguments.key,
                                   timeout_s=arguments.timeout_s)
    run = admission.run
    published = "left to the relays"
    broker = _broker(arguments)
    if broker is not None:
        async with _Closing(broker):
            published = "published" if await ledger.publish(run.run_id, 0, broker) else "not publishable"
    print(run_table(["run", "status", "workflow", "queue", "priority", "new", "delivery"],
                    [[run.run_id, run.status.value, f"{run.workflow.name}@{run.workflow.revision}", run.queue,
                      run.priority, "yes" if admission.created else "no (replay)", published]]))
    await _warn_unless_served(ledger, run.queue)
    return 0


SERVED_WITHIN_S = 150.0
"""How recently a Run worker must have served a queue for ``runs admit`` not to warn: a
running worker records a report after each relay round, at least every ``--relay-seconds``
(at most 60) plus the round itself, so a live worker is always seen within this."""


async def _warn_unless_served(ledger: RunLedger, queue: str) -> None:
    """Say so on stderr when no Run worker served ``queue`` lately: the Run is admitted
    and durable, but nothing will run it until a worker serves its queue."""
    try:
        served = await ledger.recovery_reports.served_queues(SERVED_WITHIN_S)
    except TenureError:
        return  # a database behind runs_v6 cannot tell: say nothing rather than guess
    if queue not in served:
        print(f"warning: no Run worker has served the queue {queue!r} in the last {SERVED_WITHIN_S:g} s; the Run "
              f"waits until one does (tenure runs worker --queue {shlex.quote(queue)} ...)", file=sys.stderr)


MAX_PAYLOAD_FILE_BYTES = 16 * 1024 * 1024
"""The most a payload file or stdin may hold (the ledger bounds the payload itself)."""


def _payload_text(arguments: argparse.Namespace) -> tuple[str, str]:
    """The payload's JSON text and the field it came from: ``--payload-file PATH``,
    ``--payload -`` (stdin) or ``--payload JSON``. At most 16 MiB are read (as bytes);
    an unreadable file is refused without its path or contents."""
    if arguments.payload_file is None and arguments.payload != "-":
        return str(arguments.payload), "payload"
    field = "payload_file" if arguments.payload_file is not None else "payload"
    try:
        if arguments.payload_file is not None:
            with open(arguments.payload_file, "rb") as source:
                data = source.read(MAX_PAYLOAD_FILE_BYTES + 1)
        else:
            data = sys.stdin.buffer.read(MAX_PAYLOAD_FILE_BYTES + 1)
        if len(data) > MAX_PAYLOAD_FILE_BYTES:
            raise ConfigValidationError("invalid_payload", fields=(field,), problems=("too_large",))
        return data.decode("utf-8"), field
    except (OSError, UnicodeDecodeError):
        raise ConfigValidationError("invalid_payload", fields=(field,), problems=("unreadable",)) from None


async def _list(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    status = None if arguments.status is None else RunStatus(arguments.status)
    page = await ledger.list_runs(status=status, limit=arguments.limit)
    rows = [[run.run_id, run.status.value, f"{run.workflow.name}@{run.workflow.revision}", run.queue, run.priority,
             run.enqueue_seq, run.node, _when(run.created_at)] for run in page.items]
    print(run_table(["run", "status", "workflow", "queue", "priority", "seq", "node", "created"], rows))
    if page.next_cursor is not None:
        print(f"(more: raise --limit above {arguments.limit})")
    return 0


async def _show(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    run = await ledger.get(arguments.run_id)
    if run is None:
        print("no such Run")
        return 2
    delivery = await ledger.get_delivery(run.run_id, run.enqueue_seq)
    # A Run parked on a consent: its verdict so far and its deadline (the relays apply it).
    waits_on: list[list[object]] = []
    consent = None
    if run.owner_kind is WaitKind.CONSENT and run.owner_id is not None:
        consent = await ledger.consents.get(run.owner_id)
        if consent is not None:
            payload_bytes = len(canonical_json(consent.payload).encode())
            waits_on += [
                ["consent", f"{consent.status.value}, deadline {_when(consent.expires_at) or 'none'}"],
                ["consent for", f"tool {clean_text(consent.tool_name, one_line=True)}"],
                ["consent asked", _when(consent.created_at)],
                ["consent payload", f"{payload_bytes} bytes of JSON"
                 + ("" if arguments.show_payload else " (--show-payload prints it)")],
            ]
            if consent.decided_by is not None:
                waits_on.append(["consent decided", f"by {clean_text(consent.decided_by, one_line=True)} at {_when(consent.decided_at)}"])
    wakes: list[list[object]] = [] if run.wake_at is None else [["wakes at", _when(run.wake_at)]]
    # A Run admitted with a timeout: its deadline (the relays cancel it then, reason "timeout").
    wakes += [] if run.deadline is None else [["deadline", _when(run.deadline)]]
    rows: list[list[object]] = [
        ["status", run.status.value], ["workflow", f"{run.workflow.name}@{run.workflow.revision}"],
        ["queue", run.queue], ["priority", run.priority], ["sequence", run.enqueue_seq], ["node", run.node],
        ["owner", None if run.owner_kind is None else f"{run.owner_kind.value} {run.owner_id}"],
        *waits_on,
        *wakes,
        ["error", clean_text(run.error, one_line=True)], ["started", _when(run.started_at)],
        ["updated", _when(run.updated_at)],
        ["result", None if run.result is None else f"{len(canonical_json(run.result).encode())} bytes of JSON"
         + ("" if arguments.result else " (--result prints it)")],
        ["lost hops retried", f"{run.hop_retries} of {run.workflow.max_hop_retries}"],
        ["retry of", run.retry_of],
        ["delivery", None if delivery is None else
         f"{delivery.state.value} ({'resume' if delivery.resume else 'fresh'}, {delivery.publish_attempts} publish calls)"],
    ]
    print(run_table(["run", run.run_id], rows))
    if arguments.result and run.result is not None:
        print(canonical_json(run.result))
    if arguments.show_payload and consent is not None:
        print(canonical_json(consent.payload))
    return 0


async def _retry(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    admission = await ledger.retry(arguments.run_id)
    if admission is None:
        print("no such Run")
        return 2
    run = admission.run
    published = "left to the relays"
    broker = _broker(arguments)
    if broker is not None:
        async with _Closing(broker):
            published = "published" if await ledger.publish(run.run_id, 0, broker) else "not publishable"
    print(run_table(["run", "retry of", "status", "new", "delivery"],
                    [[run.run_id, run.retry_of, run.status.value, "yes" if admission.created else "no (replay)",
                      published]]))
    return 0


async def _cancel(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    ticket = await ledger.begin_cancel(arguments.run_id)
    if ticket is None:
        print("not cancelled: the Run finished first, or does not exist")
        return 2
    broker = _broker(arguments)
    state = "cancelling (finished by the next startup reconciliation, or again with --broker)"
    if broker is not None:
        async with _Closing(broker):
            try:
                await ledger.finish_cancel(ticket.run_id, ticket.enqueue_seq, broker)
                state = "cancelled"
            except TenureError as error:
                if error.code is not ErrorCode.RUN_CONTAINMENT_UNPROVEN:
                    raise
                state = "cancelling (containment not proven yet: repeat the command)"
    elif ticket.already_cancelled:
        state = "cancelled"
    print(run_table(["run", "state"], [[ticket.run_id, state]]))
    return 0


async def _consent(ledger: RunLedger, arguments: argparse.Namespace) -> int:
    consent = await ledger.consents.get(arguments.consent_id)
    if consent is None:
        print("no such consent")
        return 2
    decided = await ledger.consents.decide(consent.consent_id, VERDICTS[arguments.verdict], decided_by=arguments.by)
    broker = _broker(arguments)
    if broker is not None:
        async with _Closing(broker):
            seq = await resume_and_publish(ledger, broker, consent.run_id, owner_id=consent.consent_id)
    else:
        seq = await ledger.resume(consent.run_id, owner_id=consent.consent_id)
    now = await ledger.consents.get(consent.consent_id)
    run = await ledger.get(consent.run_id)
    assert now is not None and run is not None
    # A relay of a running worker may resume the Run first: the Run's state says where it is.
    resumed = "no" if seq is None else f"yes, hop {seq}" + ("" if broker is not None else " (published by the relays)")
    print(run_table(["consent", "verdict", "decided by", "deadline", "this call decided", "this call resumed",
                     "run now"],
                    [[now.consent_id, now.status.value, now.decided_by, _when(now.expires_at),
                      "yes" if decided else "no", resumed, f"{run.status.value} at hop {run.enqueue_seq}"]]))
    return 0


ACTIONS = {"retry": _retry, "worker": _worker, "admit": _admit, "list": _list, "show": _show, "cancel": _cancel, "consent": _consent}


async def _run(arguments: argparse.Namespace) -> int:
    async with RunLedger(arguments.db) as ledger:
        # Probed before the action does anything, as `tenure worker` does: a database never
        # migrated is a refusal (exit 2) for every action, and nothing has been written yet.
        # A read by an ID no Run has: it meets the tables but no stored document, so one
        # unreadable Run (corrupt_row) cannot stop the commands that would mend it.
        refused = await refused_unless_migrated(ledger.get(_PROBE_RUN_ID), "tenure runs")
        return refused if refused is not None else await ACTIONS[arguments.action](ledger, arguments)


def run_runs(arguments: argparse.Namespace) -> int:
    return asyncio.run(_run(arguments))
