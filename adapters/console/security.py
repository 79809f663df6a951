"""The console's guards as plain functions of a per-process secret: who may ask, and which
forms a page of the console itself sent.

**Token.** Given a token (required off loopback), every request must carry it: the
header ``Authorization: Bearer TOKEN``, or the session cookie the login form sets after
it was given the token once. Tokens are compared with :func:`hmac.compare_digest`. The
session cookie holds no token: it is a random value and its HMAC under the process's
secret (:meth:`Guard.new_session`), ``HttpOnly`` and ``SameSite=Strict``; a restart
(a new secret) ends every session.

**CSRF.** A state-changing request is a POST carrying a CSRF token, refused otherwise
(403). The scheme is the signed double submit: the first page a browser gets sets a
cookie with a random nonce, and every form of the console carries
``HMAC(secret, nonce)``; a POST is accepted only when its form field equals the HMAC of
its own cookie's nonce. Another site can make a browser send the cookie (it cannot read
it), but it can neither read a page of the console (the same-origin policy) nor compute
the HMAC without the secret, so it cannot forge the field; and planting a nonce cookie
of its choosing gains nothing either. Unlike a token kept on the server, nothing is
stored: any number of tabs and processes' restarts (forms of the old process are then
refused; reload the page) are handled alike. It guards the loopback-only console too: a
page of any site the operator visits can POST to ``127.0.0.1``.

**Host.** Without a token, a request is answered only when its ``Host`` header names a
loopback address or ``localhost`` (:func:`host_allowed`): a site that re-points its own
name at 127.0.0.1 (DNS rebinding) would otherwise read the console as its own origin.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets

from .settings import is_loopback

__all__ = ["Guard", "host_allowed", "safe_next", "SESSION_COOKIE", "CSRF_COOKIE", "CSRF_FIELD"]

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

    def __init__(self, token: str | None, secret: bytes | None = None) -> None:
        self._token = None if token is None else _encoded(token)
        self._secret = secret if secret is not None else secrets.token_bytes(32)

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
        """A session cookie's value: a random nonce and its HMAC (no token inside)."""
        nonce = secrets.token_urlsafe(24)
        return f"{nonce}.{self._mac('session', nonce)}"

    def session_valid(self, cookie: str | None) -> bool:
        if cookie is None:
            return False
        nonce, _, mac = cookie.partition(".")
        if not _NONCE.fullmatch(nonce) or not _MAC.fullmatch(mac):
            return False
        return hmac.compare_digest(mac, self._mac("session", nonce))

    @staticmethod
    def new_csrf_nonce() -> str:
        return secrets.token_urlsafe(24)

    @staticmethod
    def csrf_nonce_valid(nonce: str | None) -> bool:
        return nonce is not None and _NONCE.fullmatch(nonce) is not None

    def csrf_token(self, nonce: str) -> str:
        """What a form carries for the browser holding the nonce cookie ``nonce``."""
        return self._mac("csrf", nonce)

    def csrf_valid(self, nonce: str | None, given: str | None) -> bool:
        """Whether a form's ``given`` token was made for the cookie's ``nonce``."""
        if not self.csrf_nonce_valid(nonce) or given is None or not _MAC.fullmatch(given):
            return False
        assert nonce is not None
        return hmac.compare_digest(given, self.csrf_token(nonce))


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
