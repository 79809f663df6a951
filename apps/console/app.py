"""The console's HTTP side: a Starlette application (:func:`create_app`) serving
server-rendered pages (Jinja2, autoescaping on for every template) over
:mod:`tenure.apps.console.pages`.

URL map (every ID in a path is percent-encoded; ``?outcome=WORD`` on an object's page
says what the form that redirected there did):

=======  ==========================================  ===============================================
method   path                                         what
=======  ==========================================  ===============================================
GET      ``/``                                        overview: queues, throughput, Runs by status,
                                                      recovery reports (counts refresh live)
GET      ``/api/live``                                the overview's counts as JSON (the poll)
GET      ``/jobs``                                    jobs: ``queue`` (tasks, validation, pipeline,
                                                      streaming), ``status``, ``task_queue``,
                                                      ``task``, ``older_than`` (90s, 15m, 12h, 7d),
                                                      ``after`` (the next page's position)
GET      ``/jobs/{queue}/{job_id}``                   a job (``reveal=payload|result|progress``)
POST     ``/jobs/{queue}/{job_id}/retry``             ``retry_failed`` (not for streaming)
POST     ``/jobs/{queue}/{job_id}/cancel``            the queue's administrative ``cancel``
GET      ``/runs``                                    Runs: ``status``, ``queue``, ``workflow``,
                                                      ``after``
GET      ``/runs/{run_id}``                           a Run (``reveal=payload|result|checkpoint``)
POST     ``/runs/{run_id}/cancel``                    ``begin_cancel`` (no broker: see the page)
GET      ``/consents``                                the inbox: pending (``after``) and decided
                                                      (``decided_after``) consents
GET      ``/consents/{consent_id}``                   a consent (``reveal=payload``)
POST     ``/consents/{consent_id}/decide``            ``verdict=grant|deny`` and ``by=NAME``
GET/POST ``/login``                                   the token form (only with a token)
POST     ``/logout``                                  ends the browser's session
GET      ``/static/console.css``, ``console.js``      the style sheet and the poll script
=======  ==========================================  ===============================================

Every POST carries the form field ``csrf_token`` (see
:mod:`tenure.apps.console.security`); a GET never changes anything. Answers: 400 for
a malformed filter or form (the page names the field and what it takes, never the value),
403 for a missing or wrong CSRF token, 404 for an unknown page or ID, 401 (or, for a
page, a redirect to ``/login``) without the token, 429 with ``Retry-After`` for a token
(login form or Bearer header) from an address locked out after failed guesses (see
:class:`~tenure.apps.console.security.SignInThrottle`), 503 when the database failed
(its reason word, never the driver's text), 500 for anything else (logged by its type
only). No error page repeats what was sent.

Every response carries ``Server-Timing: app;dur=MILLISECONDS`` (the server's time for the
request, from the first byte the application saw to the response's headers), and
headers that keep pages to themselves: a Content-Security-Policy allowing only the
console's own style sheet, script and requests (no inline script or style anywhere), no
framing, no referrer, no caching of pages (a revealed payload is never stored by the
browser).

Live counts: ``console.js`` polls ``/api/live`` every ``refresh_seconds`` (5 by default,
paused while the tab is hidden) and writes each number into the element marked
``data-live="KEY"`` (text only, never markup). A poll, not a push: PostgreSQL's
notifications announce only new pending work (what wakes idle workers), not
completions, failures or verdicts, so they could not drive these counts; one poll works
the same on SQLite and PostgreSQL. The server reads the counts at most once a second
however many tabs poll.

Stable hooks for tests and scripts: every page's ``<main>`` has ``data-page`` (its name);
counts, actions, forms, filters and rows carry ``data-testid`` (listed in
``docs/console.md``); rows carry ``data-job-id``, ``data-run-id`` or
``data-consent-id``.

Why Starlette: it is small (a routing and request layer, no ORM or settings framework),
async like tenure's stores (a page awaits the same facades a worker does, on the same
event loop), renders templates on the server (no JavaScript build, no client framework)
and ships a test client that drives the application in process.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import pathlib
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from tenure.model import ConfigValidationError, TenureError
from tenure.model.errors import is_authored_word

from tenure.adapters.core.tables import Unreadable
from tenure.adapters.core.text import clean_text
from .pages import BadInput, NotFound, Page, Pages, Redirect, ago, duration, when
from .reads import ConsoleData
from .security import (
    CSRF_COOKIE,
    CSRF_FIELD,
    SESSION_COOKIE,
    Guard,
    SignInThrottle,
    host_allowed,
    safe_next,
    same_origin,
)
from .settings import ConsoleSettings

if TYPE_CHECKING:
    from jinja2 import Environment
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response

__all__ = ["create_app", "SECURITY_HEADERS", "MAX_FORM_BYTES", "TEMPLATES", "STATIC"]

log = logging.getLogger("tenure.apps.console")

TEMPLATES = pathlib.Path(__file__).resolve().parent / "templates"
STATIC = pathlib.Path(__file__).resolve().parent / "static"
_STATIC_TYPES = {"console.css": "text/css; charset=utf-8", "console.js": "text/javascript; charset=utf-8"}
STATIC_FILES = {name: (STATIC / name).read_bytes() for name in _STATIC_TYPES}
"""The static files, read once when the module is imported (never from disk per request)."""

MAX_FORM_BYTES = 64 * 1024
"""The most a form's body may hold (a verdict and a name need far less)."""

SECURITY_HEADERS = (
    ("content-security-policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"),
    ("x-content-type-options", "nosniff"),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
)

_LIVE_MIN_INTERVAL_S = 1.0
_PUBLIC_PATHS = ("/login", "/static/")
"""What answers without the token: the login form, and the style sheet and script it uses."""


class _Refused(Exception):
    """A request refused before its view ran (403 CSRF, 413 too large, 415 not a form,
    429 too many failed sign-ins: ``headers`` then holds its ``Retry-After``)."""

    def __init__(self, status: int, title: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(title)
        self.status = status
        self.title = title
        self.message = message
        self.headers = dict(headers or {})


_TOO_MANY_TITLE = "Too many failed sign-ins"
_TOO_MANY_MESSAGE = ("Tokens from this address are not checked for a while after repeated failures. Try again after "
                     "the time the Retry-After header gives.")


def _client(scope: Mapping[str, Any]) -> str:
    """The client's address as the server saw it (the socket's peer, never a header a
    client could forge)."""
    client = scope.get("client")
    return str(client[0])[:64] if client else "unknown"


def _environment() -> Environment:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    environment = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=True, undefined=StrictUndefined,
                              trim_blocks=True, lstrip_blocks=True)
    environment.filters.update(when=when, ago=ago, duration=duration, printable=clean_text,
                               q=lambda value: urllib.parse.quote(str(value), safe=""))
    # ``row is unreadable``: a listed row tenure cannot read (shown as corrupt_row).
    environment.tests["unreadable"] = lambda value: isinstance(value, Unreadable)
    return environment


def _cookies(headers: Mapping[str, str]) -> dict[str, str]:
    """The request's cookies (only names and values; attributes never come back)."""
    found: dict[str, str] = {}
    for part in headers.get("cookie", "").split(";"):
        name, separator, value = part.strip().partition("=")
        if separator and name:
            found.setdefault(name, value.strip().strip('"'))
    return found


def _headers(scope: Mapping[str, Any]) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


class _Console:
    """One console's state: settings, guard, views, templates and the live-count cache."""

    def __init__(self, settings: ConsoleSettings, data: ConsoleData, secret: bytes | None,
                 throttle: SignInThrottle | None, *, owns_data: bool) -> None:
        self.settings = settings
        self.data = data
        self.owns_data = owns_data
        """Whether the application made ``data`` (then its lifespan's end closes it)."""
        self.guard = Guard(settings.token, secret)
        self.throttle = SignInThrottle() if throttle is None else throttle
        self.pages = Pages(data, settings)
        self.environment = _environment()
        self._live: dict[str, tuple[float, dict[str, Any]]] = {}
        self._live_lock = asyncio.Lock()

    def render(self, template: str, context: Mapping[str, Any], csrf_nonce: str | None,
               session: str | None = None) -> str:
        base = {"csrf_token": "" if csrf_nonce is None else self.guard.csrf_token(csrf_nonce, session),
                "csrf_field": CSRF_FIELD, "token_required": self.guard.token_required,
                "refresh_seconds": self.settings.refresh_seconds, "database": self.data.database,
                "live": False, "pending_consents": None, "nav": None, "outcome": None, "message": None}
        return self.environment.get_template(template).render({**base, **context})

    def error_page(self, status: int, title: str, message: str, *, field: str | None = None,
                   takes: str | None = None) -> str:
        return self.render("error.html", {"status": status, "title": title, "error_message": message,
                                          "field": field, "takes": takes}, None)

    async def live(self, scope: str | None) -> dict[str, Any]:
        """The counts a poll asks for (``scope``: ``badge`` for the inbox's badge alone),
        each kind read at most once per second whatever the number of polls."""
        kind = "badge" if scope == "badge" else "all"
        async with self._live_lock:
            now = time.monotonic()
            cached = self._live.get(kind)
            if cached is None or now - cached[0] >= _LIVE_MIN_INTERVAL_S:
                cached = (now, await self.pages.live(kind))
                self._live[kind] = cached
            return cached[1]

    # --- the gate every request passes -------------------------------------------------------

    def authenticated(self, scope: Mapping[str, Any], headers: Mapping[str, str]) -> bool | int:
        """True to let the request through, False when it carries no valid credential, or
        the seconds its client must wait (429): a Bearer token is a guess, throttled."""
        if not self.guard.token_required or self.guard.session_valid(_cookies(headers).get(SESSION_COOKIE)):
            return True
        authorization = headers.get("authorization")
        if not self.guard.is_bearer(authorization):
            return False
        client = _client(scope)
        wait = self.throttle.retry_after(client)
        if wait is not None:
            return wait
        if self.guard.bearer_matches(authorization):
            return True
        self.throttle.failed(client, "a bearer token")
        return False

    def too_many(self, wait: int) -> tuple[int, list[tuple[str, str]], bytes]:
        body = self.error_page(429, _TOO_MANY_TITLE, _TOO_MANY_MESSAGE)
        return 429, [("content-type", "text/html; charset=utf-8"), ("retry-after", str(wait))], body.encode()

    def gate(self, scope: Mapping[str, Any]) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """The answer for a request refused at the gate, or None to let it through."""
        headers = _headers(scope)
        if self.settings.loopback_only and not host_allowed(headers.get("host")):
            body = self.error_page(400, "Not this host",
                                   "This console answers requests addressed to 127.0.0.1 or localhost only.")
            return 400, [("content-type", "text/html; charset=utf-8")], body.encode()
        path = str(scope.get("path", "/"))
        if path.startswith(_PUBLIC_PATHS):
            return None
        verdict = self.authenticated(scope, headers)
        if verdict is True:
            return None
        if verdict is not False:
            return self.too_many(verdict)
        if scope.get("method") in ("GET", "HEAD") and not path.startswith("/api/"):
            target = path + ("?" + scope["query_string"].decode("latin-1") if scope.get("query_string") else "")
            location = "/login?" + urllib.parse.urlencode({"next": safe_next(target)})
            return 303, [("location", location), ("content-type", "text/plain; charset=utf-8")], b""
        body = self.error_page(401, "Token required",
                               "Send the console's token as Authorization: Bearer TOKEN, or sign in at /login.")
        return 401, [("content-type", "text/html; charset=utf-8"),
                     ("www-authenticate", 'Bearer realm="tenure console"')], body.encode()


class _Gatekeeper:
    """Pure ASGI middleware: times every request (``Server-Timing``), adds the security
    headers to every response and refuses, before any view runs, a request addressed to
    another host (loopback-only consoles) or without the token (consoles with one)."""

    def __init__(self, app: Any, console: _Console) -> None:
        self.app = app
        self.console = console

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        static = str(scope.get("path", "")).startswith("/static/")

        async def stamped(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.lower() for name, _ in headers}
                extra = [*SECURITY_HEADERS,
                         ("server-timing", f'app;dur={(time.perf_counter() - started) * 1000:.1f};desc="server time"')]
                if b"cache-control" not in present:
                    extra.append(("cache-control", "no-cache" if static else "no-store"))
                headers += [(name.encode("latin-1"), value.encode("latin-1")) for name, value in extra]
                message = {**message, "headers": headers}
            await send(message)

        refused = self.console.gate(scope)
        if refused is None:
            await self.app(scope, receive, stamped)
            return
        status, headers, body = refused
        await stamped({"type": "http.response.start", "status": status,
                       "headers": [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]})
        await stamped({"type": "http.response.body", "body": body if scope.get("method") != "HEAD" else b""})


def create_app(settings: ConsoleSettings, *, data: ConsoleData | None = None, secret: bytes | None = None,
               throttle: SignInThrottle | None = None) -> Starlette:
    """The console for ``settings`` as an ASGI application. Its database facades
    (``data``: made here unless given) connect on the first read and are closed when the
    application's lifespan ends (those made here; a caller closes its own). ``secret``
    keys the session and CSRF HMACs (default: fresh, so a restart ends every session).
    ``throttle`` counts failed sign-ins (default: a fresh one on the monotonic clock; a
    test passes one on a clock it steps).

    The views are this module's functions; each finds the console's state on
    ``request.app.state.console`` (set here), so nothing of a request lives in a closure."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException
    from starlette.middleware import Middleware
    from starlette.routing import Route

    console = _Console(settings, ConsoleData(settings.db_url) if data is None else data, secret, throttle,
                       owns_data=data is None)
    routes = [Route(path, endpoint, methods=list(methods)) for path, endpoint, methods in _ROUTES]
    app = Starlette(routes=routes, middleware=[Middleware(_Gatekeeper, console=console)],
                    exception_handlers={HTTPException: _http_error}, lifespan=_lifespan)
    app.state.console = console
    return app


def _console_of(request: Request) -> _Console:
    console: _Console = request.app.state.console
    return console


@contextlib.asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    try:
        yield
    finally:
        console: _Console = app.state.console
        if console.owns_data:
            await console.data.close()


# --- answering a view ----------------------------------------------------------------------------

def _html(request: Request, status: int, body: str, nonce: str | None, fresh: bool) -> Response:
    from starlette.responses import HTMLResponse

    response = HTMLResponse(body, status_code=status)
    if fresh and nonce is not None:
        response.set_cookie(CSRF_COOKIE, nonce, httponly=True, samesite="strict", path="/",
                            secure=request.url.scheme == "https")
    return response


async def _answer(request: Request, view: Awaitable[Page | Redirect]) -> Response:
    """Await a view (a coroutine not started yet) and turn what it answers (or raises)
    into a response."""
    from starlette.responses import RedirectResponse

    console = _console_of(request)
    nonce = request.cookies.get(CSRF_COOKIE)
    fresh = not console.guard.csrf_nonce_valid(nonce)
    if fresh:
        nonce = console.guard.new_csrf_nonce()
    try:
        result = await view
        if isinstance(result, Redirect):
            return RedirectResponse(result.location, status_code=303)
        body = console.render(result.template, result.context, nonce, request.cookies.get(SESSION_COOKIE))
    except _Refused as refused:
        response = _html(request, refused.status,
                         console.error_page(refused.status, refused.title, refused.message), nonce, fresh)
        response.headers.update(refused.headers)
        return response
    except BadInput as bad:
        body = console.error_page(400, "Bad request", "The request was not understood.", field=bad.field,
                                  takes=bad.takes)
        return _html(request, 400, body, nonce, fresh)
    except NotFound:
        return _html(request, 404, console.error_page(404, "Not found", "Nothing is stored under that address."),
                     nonce, fresh)
    except ConfigValidationError as refused_by_library:
        fields = [name for name in refused_by_library.fields if is_authored_word(name)]
        body = console.error_page(400, "Refused", "The request was refused.",
                                  field=", ".join(fields) or None, takes=", ".join(refused_by_library.problems))
        return _html(request, 400, body, nonce, fresh)
    except TenureError as failure:
        body = console.error_page(503, "Database failed", f"The database failed ({failure.reason}). Try again.")
        return _html(request, 503, body, nonce, fresh)
    except Exception as error:  # noqa: BLE001 - never a traceback page; the type alone is logged
        log.error("console: a request failed with %s", type(error).__name__)
        return _html(request, 500, console.error_page(500, "Server error", "The console failed to answer."),
                     nonce, fresh)
    return _html(request, result.status, body, nonce, fresh)


async def _form(request: Request) -> dict[str, str]:
    """The POSTed form, once its CSRF token proved it came from a page of this console."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise _Refused(415, "Not a form", "Send the console's own form (application/x-www-form-urlencoded).")
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_FORM_BYTES:
        raise _Refused(413, "Too large", "The form is larger than the console takes.")
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            raise _Refused(413, "Too large", "The form is larger than the console takes.")
    try:
        pairs = urllib.parse.parse_qsl(body.decode("utf-8"), keep_blank_values=True, max_num_fields=32,
                                       strict_parsing=False)
    except (UnicodeDecodeError, ValueError):
        raise BadInput("form", "the console's own form") from None
    fields = dict(pairs)
    if not same_origin(request.headers) or not _console_of(request).guard.csrf_valid(
            request.cookies.get(CSRF_COOKIE), fields.get(CSRF_FIELD), request.cookies.get(SESSION_COOKIE)):
        raise _Refused(403, "Refused", "The form's CSRF token is missing or not this console's: reload the "
                                       "page and submit it again.")
    return fields


def _query(request: Request) -> dict[str, str]:
    return dict(request.query_params)


# --- the pages (GET) -----------------------------------------------------------------------------

async def _overview(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.overview(_query(request)))


async def _live(request: Request) -> Response:
    from starlette.responses import JSONResponse

    try:
        return JSONResponse(await _console_of(request).live(request.query_params.get("scope")))
    except TenureError as failure:
        return JSONResponse({"error": failure.reason}, status_code=503)
    except Exception as error:  # noqa: BLE001 - the poll only misses one round
        log.error("console: a live read failed with %s", type(error).__name__)
        return JSONResponse({"error": "failed"}, status_code=500)


async def _jobs(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.jobs(_query(request)))


async def _job(request: Request) -> Response:
    parameters = request.path_params
    return await _answer(request, _console_of(request).pages.job(parameters["queue"], parameters["job_id"],
                                                                 _query(request)))


async def _runs(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.runs(_query(request)))


async def _run(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.run(request.path_params["run_id"], _query(request)))


async def _consents(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.consents(_query(request)))


async def _consent(request: Request) -> Response:
    return await _answer(request, _console_of(request).pages.consent(request.path_params["consent_id"],
                                                                     _query(request)))


async def _static(request: Request) -> Response:
    from starlette.responses import HTMLResponse, Response

    name = request.path_params["name"]
    if name not in _STATIC_TYPES:
        return HTMLResponse(_console_of(request).error_page(404, "Not found", "Nothing is stored under that address."),
                            status_code=404)
    return Response(STATIC_FILES[name], media_type=_STATIC_TYPES[name], headers={"cache-control": "no-cache"})


async def _http_error(request: Request, error: Exception) -> Response:
    from starlette.exceptions import HTTPException
    from starlette.responses import HTMLResponse

    console = _console_of(request)
    status = error.status_code if isinstance(error, HTTPException) else 500
    if status == 405:
        body = console.error_page(405, "Method not allowed", "This address does not take that method.")
    elif status == 404:
        body = console.error_page(404, "Not found", "Nothing is stored under that address.")
    else:
        body = console.error_page(status, "Refused", "The request was refused.")
    return HTMLResponse(body, status_code=status)


# --- the actions (POST: each reads the form first, which proves its CSRF token) ------------------

async def _job_acted(request: Request, action: str) -> Redirect:
    await _form(request)
    return await _console_of(request).pages.job_action(request.path_params["queue"], request.path_params["job_id"],
                                                       action)


async def _job_retry(request: Request) -> Response:
    return await _answer(request, _job_acted(request, "retry"))


async def _job_cancel(request: Request) -> Response:
    return await _answer(request, _job_acted(request, "cancel"))


async def _run_cancelled(request: Request) -> Redirect:
    await _form(request)
    return await _console_of(request).pages.run_cancel(request.path_params["run_id"])


async def _run_cancel(request: Request) -> Response:
    return await _answer(request, _run_cancelled(request))


async def _consent_decided(request: Request) -> Redirect:
    fields = await _form(request)
    return await _console_of(request).pages.consent_decide(request.path_params["consent_id"], fields)


async def _consent_decide(request: Request) -> Response:
    return await _answer(request, _consent_decided(request))


async def _login_form(request: Request) -> Page:
    return Page("login.html", {"title": "Sign in", "next": safe_next(request.query_params.get("next")),
                               "failed": False})


async def _signed_in(request: Request) -> Page | Redirect:
    """A login form's token checked: a Redirect (to the page it came from) only when it
    is the console's token; a failed or locked-out guess answers anything else."""
    console = _console_of(request)
    fields = await _form(request)
    client = _client(request.scope)
    wait = console.throttle.retry_after(client)
    if wait is not None:  # not compared: a locked-out guess learns nothing
        raise _Refused(429, _TOO_MANY_TITLE, _TOO_MANY_MESSAGE, {"retry-after": str(wait)})
    if console.guard.token_matches(fields.get("token")):
        return Redirect(safe_next(fields.get("next")))
    console.throttle.failed(client, "the login form")
    return Page("login.html", {"title": "Sign in", "next": safe_next(fields.get("next")), "failed": True}, status=401)


async def _login(request: Request) -> Response:
    from starlette.responses import RedirectResponse

    console = _console_of(request)
    if not console.guard.token_required:
        return RedirectResponse("/", status_code=303)
    if request.method == "GET":
        return await _answer(request, _login_form(request))
    response = await _answer(request, _signed_in(request))
    if response.status_code == 303:  # only a matching token redirects (see _signed_in)
        response.set_cookie(SESSION_COOKIE, console.guard.new_session(), httponly=True, samesite="strict",
                            path="/", secure=request.url.scheme == "https")
    return response


async def _signed_out(request: Request) -> Redirect:
    await _form(request)
    return Redirect("/login" if _console_of(request).guard.token_required else "/")


async def _logout(request: Request) -> Response:
    response = await _answer(request, _signed_out(request))
    if response.status_code == 303:
        _console_of(request).guard.revoke(request.cookies.get(SESSION_COOKIE))  # a copied cookie dies with it
        response.delete_cookie(SESSION_COOKIE, path="/")
    return response


_ROUTES: tuple[tuple[str, Callable[[Request], Awaitable[Response]], tuple[str, ...]], ...] = (
    ("/", _overview, ("GET",)),
    ("/api/live", _live, ("GET",)),
    ("/jobs", _jobs, ("GET",)),
    ("/jobs/{queue}/{job_id:path}/retry", _job_retry, ("POST",)),
    ("/jobs/{queue}/{job_id:path}/cancel", _job_cancel, ("POST",)),
    ("/jobs/{queue}/{job_id:path}", _job, ("GET",)),
    ("/runs", _runs, ("GET",)),
    ("/runs/{run_id}/cancel", _run_cancel, ("POST",)),
    ("/runs/{run_id}", _run, ("GET",)),
    ("/consents", _consents, ("GET",)),
    ("/consents/{consent_id}/decide", _consent_decide, ("POST",)),
    ("/consents/{consent_id}", _consent, ("GET",)),
    ("/login", _login, ("GET", "POST")),
    ("/logout", _logout, ("POST",)),
    ("/static/{name}", _static, ("GET",)),
)
"""The URL map (see the module docstring): path, view, methods. The order matters: an
action's path is tried before the object's own (``job_id`` is a path and could swallow it)."""
