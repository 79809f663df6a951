"""What each page of the console shows and what each form does, free of any web framework:
a view takes the request's path parameters, query and form as plain strings and answers
a :class:`Page` (a template and its context), a :class:`Redirect` (after a form: the
object's page with an ``outcome`` word, so reloading it repeats nothing) or a JSON
document. :mod:`tenure.apps.console.app` turns those into HTTP.

Input is checked here, before any database work: a malformed filter raises
:class:`BadInput` naming the field and what it takes (400, the value never echoed); an
ID that names nothing (or that no object could have) raises :class:`NotFound` (404).
Nothing here compares a record's state: what a job, Run or consent may do next is the
fenced API's answer (``retry_failed``, ``cancel``, ``begin_cancel``, ``decide_consent``),
which the page then reports.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
import urllib.parse
from collections.abc import Mapping
from typing import Any

from tenure.model import MAX_JSON_DEPTH, ConfigValidationError, ConsentStatus, JobStatus, RunStatus, TenureError, bounds
from tenure.model.json_values import text_problem
from tenure.model.validation import is_queue_name, micros_to_datetime

from ..jobs_cli import parse_age
from tenure.adapters.core.tables import Unreadable, json_column
from tenure.adapters.core.text import clean_text
from .reads import QUEUE_SOURCES, ConsoleData, JobView, parse_position
from .settings import ConsoleSettings

__all__ = ["Pages", "Page", "Redirect", "BadInput", "NotFound", "JOB_OUTCOMES", "RUN_OUTCOMES", "CONSENT_OUTCOMES",
           "timeline", "MAX_OPERATOR_CHARS", "when", "ago", "duration", "UNREADABLE_TEXT"]

MAX_OPERATOR_CHARS = bounds.MAX_IDENTITY_CHARS

JOB_OUTCOMES = {
    "retried": "Retried: the job is pending again with a fresh attempt budget (its ID, submission and last error "
               "kept).",
    "not_retried": "Not retried: the job did not fail (a completed or cancelled job's outcome stands).",
    "retry_unsupported": "Streaming launches have no retry: a failed launch is rerun by a forced submission.",
    "cancelled": "Cancelled: the job will not run again; a live claim's next fenced write is refused.",
    "cancel_requested": "Cancel requested: the launch is running, and its launcher acknowledges the request.",
    "not_cancelled": "Not cancelled: the job had already finished.",
}
RUN_OUTCOMES = {
    "cancelling": "Cancelling: the Run is elected for cancellation and runs no further hop. This console has no "
                  "broker, so, as `tenure runs cancel` without --broker, it leaves the rest (fencing the current hop, "
                  "proving containment) to the next startup reconciliation of a Run worker, or to `tenure runs "
                  "cancel --broker ...`.",
    "already_cancelled": "The Run was already cancelled.",
    "not_cancelled": "Not cancelled: the Run finished first.",
}
CONSENT_OUTCOMES = {
    "decided_resumed": "Decided, and the Run resumed: its next hop is queued (a running Run worker's relay "
                       "publishes it).",
    "decided": "Decided. The Run did not resume from this call: a relay had resumed it already, or it no longer "
               "waits on this consent.",
    "already_decided": "Not decided by you: someone decided this consent first.",
}

_REVEALS = {
    "job": ("payload", "result", "progress"),
    "run": ("payload", "result", "checkpoint"),
    "consent": ("payload",),
}


class BadInput(Exception):
    """A request the console refuses (400): ``field`` and what it takes."""

    def __init__(self, field: str, takes: str) -> None:
        super().__init__(field)
        self.field = field
        self.takes = takes


class NotFound(Exception):
    """No such page or object (404)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    template: str
    context: dict[str, Any]
    status: int = 200


@dataclasses.dataclass(frozen=True, slots=True)
class Redirect:
    location: str


def _quoted(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _storable(text: str, max_chars: int) -> bool:
    return bounds.is_bounded_text(text, max_chars) and text_problem(text) is None


def _given(query: Mapping[str, str], name: str) -> str | None:
    """A parameter's value, None when absent or empty (a filter form sends empty fields)."""
    value = query.get(name)
    return value if value else None


def _choice(query: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str | None:
    value = _given(query, name)
    if value is None:
        return None
    value = value.lower()
    if value not in choices:
        raise BadInput(name, ", ".join(choices[:-1]) + " or " + choices[-1] if len(choices) > 1 else choices[0])
    return value


def _text(query: Mapping[str, str], name: str, max_chars: int, takes: str) -> str | None:
    value = _given(query, name)
    if value is not None and not _storable(value, max_chars):
        raise BadInput(name, takes)
    return value


def _position(query: Mapping[str, str], name: str, key_chars: int) -> tuple[int, str] | None:
    value = _given(query, name)
    if value is None:
        return None
    try:
        return parse_position(value, key_chars)
    except ConfigValidationError:
        raise BadInput(name, "the position a next-page link gives") from None


def _reveal(query: Mapping[str, str], kind: str) -> str | None:
    return _choice(query, "reveal", _REVEALS[kind])


def _outcome(query: Mapping[str, str], messages: Mapping[str, str]) -> tuple[str | None, str | None]:
    """The outcome word a form's redirect carries and its message (an unknown word shows nothing)."""
    word = query.get("outcome")
    if word is None or word not in messages:
        return None, None
    return word, messages[word]


def _link(path: str, **parameters: str | None) -> str:
    given = {name: value for name, value in parameters.items() if value is not None}
    return path + ("?" + urllib.parse.urlencode(given) if given else "")


UNREADABLE_TEXT = (f"corrupt_row: the stored value cannot be read (not JSON, or nested deeper than {MAX_JSON_DEPTH} "
                   "levels: written outside tenure)")
"""What a revealed value shows when tenure cannot read it: the reason the API answers for
the same value, never the stored text."""


class _Unreadable:
    """A stored JSON text tenure cannot read (see :func:`_parsed`)."""


_UNREADABLE = _Unreadable()


def _document(value: Any) -> str:
    """A JSON value as shown once revealed (indented, keys sorted), or
    :data:`UNREADABLE_TEXT`. A value :func:`_parsed` read nests at most
    ``MAX_JSON_DEPTH`` levels, so encoding it cannot exhaust the stack."""
    if value is _UNREADABLE:
        return UNREADABLE_TEXT
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def _text_size(text: str | None) -> int | None:
    return None if text is None else len(text.encode("utf-8", "surrogatepass"))


def _parsed(text: str | None) -> Any:
    """A stored JSON text as a value, read by the API's own reader
    (:func:`~tenure.adapters.core.tables.json_column`: bounded nesting, no recursion on
    the way in); a text it refuses (``corrupt_row``: not JSON, or nested deeper than
    tenure reads) is :data:`_UNREADABLE`, shown as such on a page that still renders."""
    try:
        return json_column(text)
    except TenureError:  # corrupt_row, raised by the reader outside its parser's handler
        return _UNREADABLE


def timeline(detail: Any) -> list[dict[str, Any]]:
    """A Run's history as far as the database keeps it, oldest first: the Run's admission,
    first start and latest change (``created_at``, ``started_at``, ``updated_at``), each
    shown hop's delivery (opened, published, claimed by a node, settled), each consent
    (asked, decided by whom), each delegated job and service attempt (created, last
    changed) and the checkpoint (saved), and a timer's due time. A status the Run
    passed through without a stored time of its own shows only through these."""
    run = detail.run
    events: list[tuple[int, int, str]] = []

    def add(at_us: int | None, text: str) -> None:
        if at_us is not None:
            events.append((at_us, len(events), text))

    add(run.created_at_us, f"admitted on queue {run.queue} at priority {run.priority}")
    add(run.started_at_us, "first hop started")
    for delivery in sorted(detail.deliveries, key=lambda row: row.enqueue_seq):
        hop = f"hop {delivery.enqueue_seq}"
        add(delivery.created_at_us, f"{hop} opened ({'resume' if delivery.resume else 'fresh'})")
        add(delivery.published_at_us, f"{hop} published")
        add(delivery.claimed_at_us, f"{hop} claimed" + (f" by {delivery.claimed_by}" if delivery.claimed_by else ""))
        add(delivery.settled_at_us, f"{hop} settled")
    for consent in detail.consents:
        add(consent.created_at_us, f"consent asked for tool {consent.tool_name}")
        add(consent.decided_at_us, f"consent {consent.status.value}"
            + (f" by {consent.decided_by}" if consent.decided_by else ""))
    for job in detail.jobs:
        add(job.created_at_us, f"delegated job submitted ({job.runtime}, {job.profile})")
        if job.updated_at_us != job.created_at_us:
            add(job.updated_at_us, f"delegated job {job.status.value}")
    for attempt in detail.attempts:
        add(attempt.created_at_us, f"service attempt prepared for {attempt.target}")
        if attempt.updated_at_us != attempt.created_at_us:
            add(attempt.updated_at_us, f"service attempt {attempt.state.value}")
    if detail.checkpoint is not None:
        add(detail.checkpoint.saved_at_us, f"checkpoint saved by hop {detail.checkpoint.enqueue_seq}")
    add(run.wake_at_us, "timer due")
    add(run.deadline_us, "deadline (a Run not finished by then is cancelled, reason timeout)")
    add(run.updated_at_us, f"status {run.status.value} (the latest change)")
    events.sort()
    return [{"at_us": at_us, "text": clean_text(text)} for at_us, _, text in events]


_JOB_STATUSES = tuple(status.value for status in JobStatus)
_RUN_STATUSES = tuple(status.value for status in RunStatus)
_VERDICTS = {"grant": ConsentStatus.GRANTED, "deny": ConsentStatus.DENIED}


class Pages:
    """The views of one console (see the module docstring)."""

    def __init__(self, data: ConsoleData, settings: ConsoleSettings) -> None:
        self.data = data
        self.settings = settings

    async def _badge(self) -> int:
        """The pending consents, for the inbox's badge every page shows."""
        return await self.data.pending_consents()

    # --- overview and live counts -----------------------------------------------------------

    async def overview(self, query: Mapping[str, str]) -> Page:
        overview = await self.data.overview()
        return Page("overview.html", {"overview": overview, "pending_consents": overview.pending_consents,
                                      "run_statuses": _RUN_STATUSES, "job_statuses": _JOB_STATUSES,
                                      "title": "Overview", "nav": "overview", "live": True})

    async def live(self, scope: str | None) -> dict[str, Any]:
        """The counts a page's poll refreshes: the overview's (``scope`` None or ``all``),
        or only the inbox's badge (``badge``: the other pages)."""
        if scope == "badge":
            return {"values": {"consents/pending": await self.data.pending_consents()}}
        overview = await self.data.overview()
        return {"values": overview.live_values()}

    # --- jobs ------------------------------------------------------------------------------------

    def _job_filters(self, query: Mapping[str, str]) -> dict[str, Any]:
        source = _choice(query, "queue", tuple(QUEUE_SOURCES)) or "tasks"
        status = _choice(query, "status", _JOB_STATUSES)
        task_queue = _given(query, "task_queue")
        if task_queue is not None and not is_queue_name(task_queue):
            raise BadInput("task_queue", "a task queue name: letters, digits and underscores, 1 to 63")
        task = _text(query, "task", bounds.MAX_TASK_NAME_CHARS, "a task name of 1 to 255 characters")
        if source != "tasks" and (task_queue is not None or task is not None):
            raise BadInput("task_queue" if task_queue is not None else "task", "a value only with queue tasks")
        older = _given(query, "older_than")
        try:
            older_than = None if older is None else parse_age(older)
        except ConfigValidationError:
            raise BadInput("older_than", "an age with a unit: 90s, 15m, 12h or 7d") from None
        after = _text(query, "after", bounds.MAX_JOB_ID_CHARS, "the position a next-page link gives")
        return {"queue": source, "status": status, "task_queue": task_queue, "task": task, "older_than": older,
                "older_than_delta": older_than, "after": after}

    async def jobs(self, query: Mapping[str, str]) -> Page:
        filters = self._job_filters(query)
        page = await self.data.jobs_page(
            filters["queue"], status=None if filters["status"] is None else JobStatus(filters["status"]),
            task_queue=filters["task_queue"], task=filters["task"], older_than=filters["older_than_delta"],
            after=filters["after"], limit=self.settings.page_size)
        kept = {name: filters[name] for name in ("queue", "status", "task_queue", "task", "older_than")}
        next_link = None if page.next_after is None else _link("/jobs", **kept, after=page.next_after)
        first_link = _link("/jobs", **kept) if filters["after"] is not None else None
        return Page("jobs.html", {"page": page, "filters": filters, "next_link": next_link, "first_link": first_link,
                                  "sources": tuple(QUEUE_SOURCES), "job_statuses": _JOB_STATUSES,
                                  "pending_consents": await self._badge(), "title": "Jobs", "nav": "jobs"})

    def _source(self, source: str) -> str:
        if source not in QUEUE_SOURCES:
            raise NotFound()
        return source

    async def job(self, source: str, job_id: str, query: Mapping[str, str]) -> Page:
        source = self._source(source)
        reveal = _reveal(query, "job")
        view = await self.data.job(source, job_id) if _storable(job_id, bounds.MAX_JOB_ID_CHARS) else None
        if view is None:
            raise NotFound()
        if isinstance(view, Unreadable):
            return await self._unreadable("job", view, _JOB_FIELDS, f"/jobs?queue={_quoted(source)}", source)
        outcome, message = _outcome(query, JOB_OUTCOMES)
        revealed = {
            "payload": _document(view.envelope) if reveal == "payload" and view.envelope is not None else None,
            "result": _document(_parsed(view.result_json)) if reveal == "result" and view.result_json else None,
            "progress": _document(_parsed(view.progress_json)) if reveal == "progress" and view.progress_json
            else None,
        }
        return Page("job.html", {
            "info": view, "source": source, "reveal": reveal, "revealed": revealed,
            "result_bytes": None if _parsed(view.result_json) is None else _text_size(view.result_json),
            "progress_bytes": _text_size(view.progress_json), "error": clean_text(view.state.error),
            "retry_offered": source != "streaming", "path": f"/jobs/{source}/{_quoted(view.state.job_id)}",
            "outcome": outcome, "message": message, "pending_consents": await self._badge(), "title": "Job",
            "nav": "jobs"})

    async def job_action(self, source: str, job_id: str, action: str) -> Redirect:
        source = self._source(source)
        view = await self.data.job(source, job_id) if _storable(job_id, bounds.MAX_JOB_ID_CHARS) else None
        if view is None:
            raise NotFound()
        if isinstance(view, Unreadable):  # nothing can act on it (its page offers nothing)
            return Redirect(f"/jobs/{source}/{_quoted(job_id)}")
        if action == "retry":
            retried = await self.data.retry_job(source, view.state.job_id)
            outcome = "retry_unsupported" if retried is None else "retried" if retried else "not_retried"
        else:
            cancelled = await self.data.cancel_job(source, view.state.job_id)
            now = await self.data.job(source, view.state.job_id) if cancelled else None
            requested = isinstance(now, JobView) and now.state.cancel_requested
            outcome = "not_cancelled" if not cancelled else "cancel_requested" if requested else "cancelled"
        return Redirect(f"/jobs/{source}/{_quoted(view.state.job_id)}?outcome={outcome}")

    # --- Runs ------------------------------------------------------------------------------------

    async def runs(self, query: Mapping[str, str]) -> Page:
        status = _choice(query, "status", _RUN_STATUSES)
        queue = _text(query, "queue", 50, "a Run queue's name, 1 to 50 characters")
        workflow = _text(query, "workflow", 100, "a workflow's name, 1 to 100 characters")
        after = _position(query, "after", 36)
        page = await self.data.runs_page(status=None if status is None else RunStatus(status), queue=queue,
                                         workflow=workflow, after=after, limit=self.settings.page_size)
        kept: dict[str, str | None] = {"status": status, "queue": queue, "workflow": workflow}
        return Page("runs.html", {
            "page": page, "filters": kept, "run_statuses": _RUN_STATUSES,
            "next_link": None if page.next_after is None else _link("/runs", **kept, after=page.next_after),
            "first_link": _link("/runs", **kept) if after is not None else None,
            "pending_consents": await self._badge(), "title": "Runs", "nav": "runs"})

    async def run(self, run_id: str, query: Mapping[str, str]) -> Page:
        reveal = _reveal(query, "run")
        detail = await self.data.run(run_id) if _storable(run_id, 36) else None
        if detail is None:
            raise NotFound()
        if isinstance(detail, Unreadable):
            return await self._unreadable("run", detail, _RUN_FIELDS, "/runs", None)
        run = detail.run
        outcome, message = _outcome(query, RUN_OUTCOMES)
        checkpoint = detail.checkpoint
        revealed = {
            "payload": _document(_parsed(run.payload_json)) if reveal == "payload" else None,
            "result": _document(_parsed(run.result_json)) if reveal == "result" and run.result_json else None,
            "checkpoint": _document(_parsed(checkpoint.state_json))
            if reveal == "checkpoint" and checkpoint is not None else None,
        }
        return Page("run.html", {
            "detail": detail, "run": run, "reveal": reveal, "revealed": revealed,
            "payload_bytes": _text_size(run.payload_json), "result_bytes": _text_size(run.result_json),
            "checkpoint_bytes": None if checkpoint is None else _text_size(checkpoint.state_json),
            "error": clean_text(run.error), "timeline": timeline(detail), "path": f"/runs/{_quoted(run.run_id)}",
            "jobs": [{"row": job, "request_bytes": _text_size(job.request_json),
                      "result_bytes": _text_size(job.result_json)} for job in detail.jobs],
            "outcome": outcome, "message": message, "pending_consents": await self._badge(),
            "title": "Run", "nav": "runs"})

    async def _unreadable(self, kind: str, entry: Unreadable, fields: tuple[tuple[str, str], ...], back: str,
                          source: str | None) -> Page:
        """The page of a job or Run whose stored row tenure cannot read (written outside
        tenure): its ID, each state field that could be read (never a payload) and what
        happens to it; no action is offered."""
        shown = [(label, _field_text(field, entry.fields.get(field, _MISSING))) for field, label in fields]
        return Page("unreadable.html", {
            "kind": kind, "key": entry.shown_key, "fields": shown, "back": back, "source": source,
            "pending_consents": await self._badge(), "title": "Job" if kind == "job" else "Run",
            "nav": "jobs" if kind == "job" else "runs"})

    async def run_cancel(self, run_id: str) -> Redirect:
        if not _storable(run_id, 36) or await self.data.run(run_id) is None:
            raise NotFound()
        outcome = await self.data.cancel_run(run_id)
        return Redirect(f"/runs/{_quoted(run_id)}?outcome={outcome}")

    # --- consents --------------------------------------------------------------------------------

    async def consents(self, query: Mapping[str, str]) -> Page:
        after = _position(query, "after", 36)
        decided_after = _position(query, "decided_after", 36)
        page = await self.data.consents_page(pending_after=after, decided_after=decided_after,
                                             limit=self.settings.page_size)
        return Page("consents.html", {
            "page": page, "pending_consents": await self._badge(),
            "next_link": None if page.pending_next is None else _link("/consents", after=page.pending_next,
                                                                       decided_after=_given(query, "decided_after")),
            "decided_next_link": None if page.decided_next is None else _link(
                "/consents", after=_given(query, "after"), decided_after=page.decided_next),
            "first_link": "/consents" if after is not None or decided_after is not None else None,
            "title": "Consents", "nav": "consents", "live": True})

    async def consent(self, consent_id: str, query: Mapping[str, str]) -> Page:
        reveal = _reveal(query, "consent")
        detail = await self.data.consent(consent_id) if _storable(consent_id, 36) else None
        if detail is None:
            raise NotFound()
        outcome, message = _outcome(query, CONSENT_OUTCOMES)
        consent = detail.consent
        return Page("consent.html", {
            "detail": detail, "consent": consent, "run": detail.run, "reveal": reveal,
            "payload": _document(_parsed(consent.payload_json)) if reveal == "payload" else None,
            "payload_bytes": _text_size(consent.payload_json), "path": f"/consents/{_quoted(consent.consent_id)}",
            "outcome": outcome, "message": message, "pending_consents": await self._badge(),
            "title": "Consent", "nav": "consents"})

    async def consent_decide(self, consent_id: str, form: Mapping[str, str]) -> Redirect:
        verdict = _choice(form, "verdict", tuple(_VERDICTS))
        if verdict is None:
            raise BadInput("verdict", "grant or deny")
        by = _given(form, "by")
        if by is None or not _storable(by.strip(), MAX_OPERATOR_CHARS) or not by.strip():
            raise BadInput("by", f"your name, 1 to {MAX_OPERATOR_CHARS} characters")
        if not _storable(consent_id, 36) or await self.data.consent(consent_id) is None:
            raise NotFound()
        try:
            decided, resumed = await self.data.decide_consent(consent_id, _VERDICTS[verdict], by.strip())
        except LookupError:
            raise NotFound() from None
        outcome = "already_decided" if not decided else "decided_resumed" if resumed is not None else "decided"
        return Redirect(f"/consents/{_quoted(consent_id)}?outcome={outcome}")


_MISSING = object()

_JOB_FIELDS = (
    ("status", "status"), ("queue_name", "task queue"), ("task_name", "task"), ("priority", "priority"),
    ("attempts", "attempts"), ("max_attempts", "attempt budget"), ("generation", "fence generation"),
    ("owner_id", "owner"), ("fires_at_us", "due"), ("created_at_us", "created"), ("claimed_at_us", "claimed"),
    ("lease_expires_at_us", "lease expires"), ("completed_at_us", "finished"), ("error_message", "error"),
)
"""The state fields an unreadable job's page shows, each with its label (never its
envelope, result or progress: they may carry data, and may be what cannot be read)."""

_RUN_FIELDS = (
    ("status", "status"), ("workflow_name", "workflow"), ("workflow_revision", "revision"), ("queue", "queue"),
    ("priority", "priority"), ("enqueue_seq", "hop"), ("node", "node"), ("owner_kind", "waits on"),
    ("owner_id", "owner"), ("created_at_us", "created"), ("updated_at_us", "updated"), ("error", "error"),
)


def _field_text(field: str, value: Any) -> str:
    """A stored field of an unreadable row as its page shows it."""
    if value is _MISSING:
        return "(cannot be read)"
    if value is None:
        return ""
    if field.endswith("_at_us") and type(value) is int:
        return when(value)
    if isinstance(value, enum.Enum):
        return str(value.value)
    if type(value) is str:
        return clean_text(value) or ""
    return str(value)


def when(value: int | dt.datetime | None) -> str:
    """An instant (microseconds, or an aware datetime) as pages show it: UTC, to the
    millisecond."""
    if value is None:
        return ""
    moment = micros_to_datetime(value) if isinstance(value, int) else value
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


def ago(micros: int | None, now_us: int) -> str:
    """How long before ``now_us`` (database time) an instant was: ``42 s ago``, ``3 min
    ago``, ``in 5 min`` for one still to come."""
    if micros is None:
        return ""
    return duration((now_us - micros) / 1_000_000, relative=True)


def duration(seconds: float | None, *, relative: bool = False) -> str:
    """``0.4 s``, ``42 s``, ``3 min``, ``5 h``, ``2 d``."""
    if seconds is None:
        return ""
    future = seconds < 0
    value = abs(seconds)
    if value < 10:
        text = f"{value:.1f} s"
    elif value < 120:
        text = f"{value:.0f} s"
    elif value < 7200:
        text = f"{value / 60:.0f} min"
    elif value < 172_800:
        text = f"{value / 3600:.0f} h"
    else:
        text = f"{value / 86_400:.0f} d"
    if not relative:
        return text
    return f"in {text}" if future else f"{text} ago"
