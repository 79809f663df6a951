"""The console's guards as plain functions of a per-process secret: who may ask, and which
forms a page of the console itself sent.

**Token.** Given a token (required off loopback), every request must carry it: the
header ``Authorization: Bearer TOKEN``, or the session cookie the login form sets after
it was given the token once. Tokens are compared with :func:`hmac.compare_digest`. The
session cookie holds no token: it is a random value and its HMAC under the process's
secret (:meth:`Guard.new_session`), ``HttpOnly`` and ``SameSite=Strict``; a restart
(a new secret) ends every session.

**CSRF.** A state-changing request is a POST carrying a CSRF token, refused otherwise
(403). The scheme is the signed double submit, bound to the session: the first page a
browser gets sets a cookie with a random nonce, and every form of the console carries
``HMAC(secret, nonce, session)``, where the session is the browser's session cookie on a
console with a token (empty on a loopback console without one). A POST is accepted only
when its form field equals the HMAC of its own cookies. Another site can make a browser
send the cookies (it cannot read them), but it can neither read a page of the console
(the same-origin policy) nor compute the HMAC without the secret. A site that can plant
cookies for the console's host (a sibling subdomain, or another service on the same
host: cookies ignore ports) can plant a nonce of its choosing and learn its token from
the public login page, but that token is bound to an empty session, never to the
operator's; and on every console a POST whose ``Origin`` (or ``Sec-Fetch-Site``) says
it came from another origin is refused outright (:func:`same_origin`). Nothing is
stored for it: any number of tabs, and a restart (forms of the old process are then
refused; reload the page), are handled alike. It guards the loopback-only console too: a
page of any site the operator visits can POST to ``127.0.0.1``.

**Sessions** last at most :data:`SESSION_MAX_AGE_S` (12 hours) from the sign-in, and
signing out revokes the session on the server (the process keeps the revoked sessions
until they would have expired anyway), so a copied cookie dies with the sign-out.

**Host.** Without a token, a request is answered only when its ``Host`` header names a
loopback address or ``localhost`` (:func:`host_allowed`): a site that re-points its own
name at 127.0.0.1 (DNS rebinding) would otherwise read the console as its own origin.

**Guessing** is throttled (:class:`SignInThrottle`). Every token the console compares
(the login form's, or an ``Authorization: Bearer`` header's) is a guess until it matches.
An address whose guesses failed :data:`FREE_FAILURES` times in a row is locked out, first
for 1 second, then twice as long after each further failure, up to
:data:`MAX_LOCKOUT_S`; its failures are forgotten :data:`FORGET_AFTER_S` after its last
one (a correct token does not reset them: an attacker sharing an address with a
signed-in script would otherwise be handed fresh guesses). Across every address, failed
guesses spend a budget of :data:`GLOBAL_FAILURE_BURST` refilled at
:data:`GLOBAL_FAILURES_PER_SECOND` a second, so many addresses guess no faster than one.
While locked out, a guess is answered 429 with ``Retry-After`` and never compared (a
lockout that still compared would still tell a guesser when it was right). A session
cookie is no guess: it is an HMAC under a 256-bit secret, and a browser that kept one
across a restart is not an attacker; signed-in browsers are never locked out. The
throttle remembers at most :data:`MAX_TRACKED_CLIENTS` addresses (the ones that failed
least recently are forgotten first; the global budget still holds against many). Each
failed guess is logged at WARNING on ``tenure.apps.console`` (how it came and from
which address, never what was sent), at most :data:`LOG_BURST` lines a minute; a line
after a quiet spell counts the failures not logged. Behind a proxy every client has the
proxy's address, so the per-address lockout is shared: give the proxy its own limit.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections.abc import Callable, Mapping

from .settings import is_loopback

__all__ = ["Guard", "SignInThrottle", "host_allowed", "same_origin", "safe_next", "SESSION_COOKIE", "CSRF_COOKIE",
           "CSRF_FIELD", "SESSION_MAX_AGE_S", "FREE_FAILURES", "FIRST_LOCKOUT_S", "MAX_LOCKOUT_S", "FORGET_AFTER_S",
           "GLOBAL_FAILURE_BURST", "GLOBAL_FAILURES_PER_SECOND", "MAX_TRACKED_CLIENTS", "LOG_BURST"]

log = logging.getLogger("tenure.apps.console")

SESSION_MAX_AGE_S = 12 * 3600
"""How long a sign-in lasts."""

FREE_FAILURES = 5
"""Failed guesses an address may make in a row before it is locked out."""
FIRST_LOCKOUT_S = 1.0
MAX_LOCKOUT_S = 300.0
FORGET_AFTER_S = 900.0
"""An address's failures are forgotten this long after its last one (longer than any
lockout, so a lockout is never forgotten while it lasts)."""
GLOBAL_FAILURE_BURST = 60
GLOBAL_FAILURES_PER_SECOND = 1.0
MAX_TRACKED_CLIENTS = 4096
LOG_BURST = 10
"""Failed guesses logged per minute at most (in a burst of this many)."""

SESSION_COOKIE = "tenure_console_session"
CSRF_COOKIE = "tenure_console_csrf"
CSRF_FIELD = "csrf_token"

_NONCE = re.compile(r"[A-Za-z0-9_-]{16,64}")
_MAC = re.compile(r"[0-9a-f]{64}")


def _encoded(text: str) -> bytes:
    # surrogateescape: a header decoded as latin-1 or a form field with lone surrogates
    # still compares (unequal) instead of raising.
    return text.encode("utf-8", "surrogateescape")


class Guard:
    """The token (None: no token) and this process's secret (fresh unless given)."""

    def __init__(self, token: str | None, secret: bytes | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._token = None if token is None else _encoded(token)
        self._secret = secret if secret is not None else secrets.token_bytes(32)
        self._clock = clock
        self._revoked: dict[str, int] = {}
        """Signed-out sessions' nonces, each until the session would have expired."""

    @property
    def token_required(self) -> bool:
        return self._token is not None

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._secret, _encoded(f"{purpose}\n{value}"), hashlib.sha256).hexdigest()

    def token_matches(self, given: str | None) -> bool:
        """Whether ``given`` is the token (constant time in the token's contents)."""
        if self._token is None or given is None:
            return False
        return hmac.compare_digest(_encoded(given), self._token)

    @staticmethod
    def is_bearer(authorization: str | None) -> bool:
        """Whether an ``Authorization`` header offers a Bearer token (right or wrong)."""
        return authorization is not None and authorization.partition(" ")[0].lower() == "bearer"

    def bearer_matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header is ``Bearer TOKEN``."""
        if authorization is None or not self.is_bearer(authorization):
            return False
        return self.token_matches(authorization.partition(" ")[2].strip())

    def new_session(self) -> str:
        """A session cookie's value: a random nonce, when it was issued, and their HMAC
        (no token inside)."""
        nonce, issued = secrets.token_urlsafe(24), str(int(self._clock()))
        return f"{nonce}.{issued}.{self._mac('session', nonce + '.' + issued)}"

    def _session_parts(self, cookie: str | None) -> tuple[str, int] | None:
        """The nonce and issue time of a well-formed, signed session cookie, or None."""
        if cookie is None:
            return None
        nonce, _, rest = cookie.partition(".")
        issued, _, mac = rest.partition(".")
        if not _NONCE.fullmatch(nonce) or not issued.isdigit() or len(issued) > 12 or not _MAC.fullmatch(mac):
            return None
        if not hmac.compare_digest(mac, self._mac("session", nonce + "." + issued)):
            return None
        return nonce, int(issued)

    def session_valid(self, cookie: str | None) -> bool:
        parts = self._session_parts(cookie)
        if parts is None:
            return False
        nonce, issued = parts
        now = self._clock()
        return issued <= now < issued + SESSION_MAX_AGE_S and nonce not in self._revoked

    def revoke(self, cookie: str | None) -> None:
        """End a session on the server (signing out): its cookie is refused from now on."""
        parts = self._session_parts(cookie)
        if parts is None:
            return
        now = self._clock()
        self._revoked = {nonce: until for nonce, until in self._revoked.items() if until > now}
        self._revoked[parts[0]] = parts[1] + SESSION_MAX_AGE_S

    @staticmethod
    def new_csrf_nonce() -> str:
        return secrets.token_urlsafe(24)

    @staticmethod
    def csrf_nonce_valid(nonce: str | None) -> bool:
        return nonce is not None and _NONCE.fullmatch(nonce) is not None

    def csrf_token(self, nonce: str, session: str | None) -> str:
        """What a form carries for the browser holding the nonce cookie ``nonce`` and the
        session cookie ``session`` (ignored on a console without a token)."""
        bound = (session or "") if self.token_required else ""
        return self._mac("csrf", f"{nonce}\n{bound}")

    def csrf_valid(self, nonce: str | None, given: str | None, session: str | None) -> bool:
        """Whether a form's ``given`` token was made for the cookies ``nonce`` and ``session``."""
        if not self.csrf_nonce_valid(nonce) or given is None or not _MAC.fullmatch(given):
            return False
        assert nonce is not None
        return hmac.compare_digest(given, self.csrf_token(nonce, session))


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether a POST may have come from a page of this console: a browser says where a
    request came from (``Sec-Fetch-Site``; ``Origin``, compared with ``Host``), and a
    request that says another origin is refused. A client that says neither (curl, a
    script) is not a browser a page could drive, and passes to the CSRF check."""
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:  # what current browsers send: it decides
        return fetch_site in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None or origin == "null":
        # No origin to compare (an old browser; a page whose referrer policy, like the
        # console's no-referrer, makes the browser send "null"): the CSRF token decides.
        return True
    scheme, separator, host = origin.partition("://")
    return bool(separator) and scheme in ("http", "https") and host == headers.get("host", "")


def host_allowed(host_header: str | None) -> bool:
    """Whether a ``Host`` header names this machine's loopback (``localhost``,
    ``127.0.0.1``, ``[::1]``; any port)."""
    if not host_header:
        return False
    host = host_header.strip()
    if host.startswith("["):  # [::1]:8787
        name, _, _ = host[1:].partition("]")
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(name)


_LOCAL_PATH = re.compile(r"/(?!/)[A-Za-z0-9/_.~%-]*(\?[A-Za-z0-9_.~%=&+-]*)?")


def safe_next(target: str | None) -> str:
    """Where the login form may send the browser next: a path of this site (never
    another host, never a scheme), else the overview."""
    if target and len(target) <= 2048 and _LOCAL_PATH.fullmatch(target):
        return target
    return "/"


class _Bucket:
    """A token bucket on an injected clock: ``capacity`` tokens, refilled at ``per_second``.
    Its level may go below zero (guesses that were let through together are all paid for)."""

    def __init__(self, capacity: float, per_second: float, now: float) -> None:
        self._capacity = capacity
        self._per_second = per_second
        self._level = capacity
        self._at = now

    def _refill(self, now: float) -> None:
        self._level = min(self._capacity, self._level + max(0.0, now - self._at) * self._per_second)
        self._at = max(self._at, now)

    def wait(self, now: float) -> float:
        """Seconds until a whole token is there (0: one is)."""
        self._refill(now)
        return max(0.0, (1 - self._level) / self._per_second)

    def spend(self, now: float) -> None:
        self._refill(now)
        self._level -= 1

    def take(self, now: float) -> bool:
        """Spend a token if a whole one is there."""
        if self.wait(now) > 0:
            return False
        self._level -= 1
        return True


@dataclasses.dataclass(slots=True)
class _Failures:
    count: int
    last_at: float
    locked_until: float


class SignInThrottle:
    """Failed token guesses, per client address and overall, on a monotonic ``clock``
    (injected: tests step it). See the module docstring for the policy.

    A caller asks :meth:`retry_after` before comparing a token (a number: answer 429
    without comparing), and reports a comparison that failed with :meth:`failed`."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        now = clock()
        self._clients: collections.OrderedDict[str, _Failures] = collections.OrderedDict()
        """Addresses with recent failures, the least recently failed first."""
        self._budget = _Bucket(GLOBAL_FAILURE_BURST, GLOBAL_FAILURES_PER_SECOND, now)
        self._log = _Bucket(LOG_BURST, LOG_BURST / 60, now)
        self._unlogged = 0

    @property
    def tracked(self) -> int:
        """How many addresses it remembers now (at most :data:`MAX_TRACKED_CLIENTS`)."""
        return len(self._clients)

    def retry_after(self, client: str) -> int | None:
        """None when ``client`` may have a token compared now; else the whole seconds
        (at least 1) until it may: its own lockout, or every address's while the global
        budget is spent."""
        now = self._clock()
        self._forget(now)
        record = self._clients.get(client)
        wait = max(self._budget.wait(now), 0.0 if record is None else record.locked_until - now)
        return None if wait <= 0 else max(1, math.ceil(wait))

    def failed(self, client: str, via: str) -> None:
        """A guess from ``client`` that did not match (``via``: how it came, for the log)."""
        now = self._clock()
        self._forget(now)
        self._budget.spend(now)
        record = self._clients.pop(client, None) or _Failures(0, now, now)
        record.count += 1
        record.last_at = now
        beyond = record.count - FREE_FAILURES
        if beyond >= 0:
            record.locked_until = now + min(MAX_LOCKOUT_S, FIRST_LOCKOUT_S * 2 ** min(beyond, 32))
        self._clients[client] = record
        while len(self._clients) > MAX_TRACKED_CLIENTS:
            self._clients.popitem(last=False)
        self._report(client, via, record, now)

    def _forget(self, now: float) -> None:
        while self._clients:
            oldest = next(iter(self._clients.values()))
            if now - oldest.last_at <= FORGET_AFTER_S:
                return
            self._clients.popitem(last=False)

    def _report(self, client: str, via: str, record: _Failures, now: float) -> None:
        if not self._log.take(now):
            self._unlogged += 1
            return
        locked = record.locked_until - now
        log.warning("console: a sign-in failed (%s from %s; %d failed in a row from that address%s%s)", via, client,
                    record.count, f"; it is locked out for {math.ceil(locked)} s" if locked > 0 else "",
                    f"; {self._unlogged} more failed sign-ins were not logged" if self._unlogged else "")
        self._unlogged = 0
