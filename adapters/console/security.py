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
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Callable, Mapping

from .settings import is_loopback

__all__ = ["Guard", "host_allowed", "same_origin", "safe_next", "SESSION_COOKIE", "CSRF_COOKIE", "CSRF_FIELD",
           "SESSION_MAX_AGE_S"]

SESSION_MAX_AGE_S = 12 * 3600
"""How long a sign-in lasts."""

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

    def bearer_matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header is ``Bearer TOKEN``."""
        if authorization is None:
            return False
        scheme, _, credentials = authorization.partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(credentials.strip())

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
