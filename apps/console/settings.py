"""What a console serves and how it is guarded: :class:`ConsoleSettings`, checked when made.

The console listens on loopback (``127.0.0.1``) unless told otherwise. Any other address
needs a token: every request must then carry it (see :mod:`tenure.apps.console.security`).
A token is a secret of at least :data:`MIN_TOKEN_CHARS` printable ASCII characters without
spaces (so it travels in a header and a form field unchanged) that looks random: at least
:data:`MIN_TOKEN_BITS` bits by :func:`estimated_token_bits` (``token_too_weak``
otherwise, so ``aaaaaaaaaaaaaaaa`` or ``0123456789abcdef`` is refused). The estimate can
only refuse a token that is visibly not random, never prove one random: make tokens
with :func:`generate_token` (``tenure console --generate-token`` prints one; 256 bits).
``TENURE_CONSOLE_TOKEN`` gives it without putting it on the command line (where ``ps``
shows it). A refusal names the setting and why, never the value given.
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import ipaddress
import math
import secrets
import string

from tenure.model import ConfigValidationError

__all__ = ["ConsoleSettings", "TOKEN_VARIABLE", "CONSOLE_HINT", "DEFAULT_HOST", "DEFAULT_PORT", "MIN_TOKEN_CHARS",
           "MAX_TOKEN_CHARS", "MIN_TOKEN_BITS", "GENERATED_TOKEN_BYTES", "estimated_token_bits", "generate_token",
           "DEFAULT_PAGE_SIZE", "DEFAULT_REFRESH_SECONDS", "is_loopback", "console_installed", "CONSOLE_MODULES"]

TOKEN_VARIABLE = "TENURE_CONSOLE_TOKEN"
"""The environment variable ``tenure console`` reads when ``--token`` is not given."""

CONSOLE_HINT = "install the console extra: pip install 'tenure[console]'"

CONSOLE_MODULES = ("starlette", "jinja2", "uvicorn")
"""What the ``console`` extra installs (none is imported until a console is made)."""

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
MIN_TOKEN_CHARS = 16
MAX_TOKEN_CHARS = 512
MIN_TOKEN_BITS = 64
"""The least a token's :func:`estimated_token_bits` may be. Guessing is throttled (see
:mod:`tenure.apps.console.security`), so 2**64 guesses are out of any attacker's
reach; a random token of 16 printable characters estimates about 100 bits, and what
:func:`generate_token` makes over 200."""
GENERATED_TOKEN_BYTES = 32
DEFAULT_PAGE_SIZE = 50
DEFAULT_REFRESH_SECONDS = 5.0
MAX_HOST_CHARS = 255


def console_installed() -> bool:
    """Whether the console extra's libraries can be imported (none is imported here)."""
    return all(importlib.util.find_spec(name) is not None for name in CONSOLE_MODULES)


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``): reachable from this
    machine only."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def _refuse(field: str, problem: str) -> ConfigValidationError:
    return ConfigValidationError("invalid_arguments", fields=(field,), problems=(problem,))


_CHARACTER_CLASSES = (string.ascii_lowercase, string.ascii_uppercase, string.digits, string.punctuation)


def estimated_token_bits(token: str) -> float:
    """A deliberately low estimate of how many bits a printable ASCII token holds, the
    smaller of two readings:

    - *novelty*: each character adds ``log2(pool)`` bits, where ``pool`` is the number of
      characters of the classes the token uses (lowercase 26, uppercase 26, digits 10,
      punctuation 32), except one that repeats the character before it or is one code
      point from it (``aaaa``, ``abab``, ``1234``, ``fedc``), which adds nothing;
    - *evenness*: ``len(token) * log2(pool)`` scaled by the token's Shannon entropy per
      character over the most that many characters could have (a token that keeps
      returning to a few characters, ``passwordpassword`` or ``acacac``, reads low).

    It cannot tell a random token from a memorable one built to look random; it refuses
    the ones that visibly are not."""
    pool = sum(len(members) for members in _CHARACTER_CLASSES if any(character in members for character in token))
    if pool < 2 or len(token) < 2:
        return 0.0
    per_character = math.log2(pool)
    novel = 1 + sum(1 for before, character in zip(token, token[1:]) if abs(ord(character) - ord(before)) > 1)
    counts = collections.Counter(token).values()
    shannon = -sum(count / len(token) * math.log2(count / len(token)) for count in counts)
    most = math.log2(min(len(token), pool))
    evenness = shannon / most if most > 0 else 0.0
    return max(0.0, min(novel * per_character, len(token) * per_character * evenness))


def generate_token() -> str:
    """A fresh console token: 32 random bytes (256 bits) as URL-safe base64, 43
    characters (what ``tenure console --generate-token`` prints)."""
    return secrets.token_urlsafe(GENERATED_TOKEN_BYTES)


def _token_problem(token: str) -> str | None:
    if len(token) < MIN_TOKEN_CHARS:
        return "token_too_short"
    if len(token) > MAX_TOKEN_CHARS:
        return "token_too_long"
    if not token.isascii() or not token.isprintable() or any(character.isspace() for character in token):
        return "token_not_printable_ascii"
    if estimated_token_bits(token) < MIN_TOKEN_BITS:
        return "token_too_weak"
    return None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConsoleSettings:
    """One console: the database it shows (``db_url``), where it listens, its token (None:
    none, loopback only), how many rows a list page holds and how often the live counts
    are refreshed. Checked when made (``ConfigValidationError`` naming the field)."""

    db_url: str = dataclasses.field(repr=False)
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = dataclasses.field(default=None, repr=False)
    page_size: int = DEFAULT_PAGE_SIZE
    refresh_seconds: float = DEFAULT_REFRESH_SECONDS

    def __post_init__(self) -> None:
        if type(self.db_url) is not str or not self.db_url:
            raise _refuse("db_url", "argument_required")
        if type(self.host) is not str or not self.host or len(self.host) > MAX_HOST_CHARS \
                or not self.host.isascii() or not self.host.isprintable() or " " in self.host:
            raise _refuse("host", "host_required")
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise _refuse("port", "integer_out_of_range")
        if self.token is not None:
            problem = _token_problem(self.token) if type(self.token) is str else "token_not_printable_ascii"
            if problem is not None:
                raise _refuse("token", problem)
        elif not is_loopback(self.host):
            raise _refuse("token", "token_required_off_loopback")
        if type(self.page_size) is not int or not 1 <= self.page_size <= 500:
            raise _refuse("page_size", "integer_out_of_range")
        if type(self.refresh_seconds) not in (int, float) or not math.isfinite(self.refresh_seconds) \
                or not 1 <= self.refresh_seconds <= 300:
            raise _refuse("refresh_seconds", "number_out_of_range")

    @property
    def loopback_only(self) -> bool:
        """No token: the console answers only requests addressed to a loopback name
        (``Host`` header), which DNS rebinding cannot forge for a page of another site."""
        return self.token is None
