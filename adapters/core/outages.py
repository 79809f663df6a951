"""One line per state change of a failing dependency, instead of one per failed call.

A worker whose database went away fails every claim, heartbeat and write until it comes
back: logged call by call, that is dozens of identical warnings a second, and the one
line an operator needs (since when, and is it back) drowns. :class:`OutageLog` keeps the
state instead and logs only its changes:

- **down**: the first failure, at WARNING, with the call and the failure's code and
  reason (never its text);
- **changed**: a failure with a code and reason not yet met in this outage, at WARNING
  (calls that alternate between two known failures are not changes);
- **still down**: at most once per ``still_every_s`` (default 60 s) while failures go
  on, at WARNING, with how long and how many;
- **back**: the first call that answers after failures, at INFO, with how long it was
  down and how many calls failed.

Every line carries ``extra`` fields (``outage``: down, changed, still_down or back;
``failures``; ``down_s``; and the ``fields`` given at construction, such as the worker
ID), so a JSON log can be filtered by them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["OutageLog", "STILL_DOWN_EVERY_S"]

STILL_DOWN_EVERY_S = 60.0


class OutageLog:
    """Tracks whether ``subject`` (for example "the database") answers, for ``logger``."""

    def __init__(self, logger: logging.Logger, subject: str, *, fields: Mapping[str, Any] | None = None,
                 still_every_s: float = STILL_DOWN_EVERY_S, clock: Callable[[], float] = time.monotonic,
                 back: str = "answers again") -> None:
        self.logger = logger
        self.subject = subject
        self.back = back
        """What the end of an outage is called ("answers again", "clean again")."""
        self.fields = dict(fields or {})
        self.still_every_s = still_every_s
        self.clock = clock
        self.failures = 0
        """Failed calls in the current outage (0: up)."""
        self._since = 0.0
        self._said = 0.0
        self._last: tuple[str, str] | None = None
        self._seen: set[tuple[str, str]] = set()
        """The (code, reason) pairs met in this outage: only a new one is a change."""

    @property
    def down(self) -> bool:
        return self.failures > 0

    def _extra(self, state: str, now: float) -> dict[str, Any]:
        return {**self.fields, "outage": state, "failures": self.failures, "down_s": round(now - self._since, 3)}

    def failed(self, call: str, code: str, reason: str) -> None:
        """A call to the subject failed with ``code`` and ``reason`` (authored words)."""
        now = self.clock()
        self.failures += 1
        if self.failures == 1:
            self._since = self._said = now
            self._last = (code, reason)
            self._seen = {self._last}
            self.logger.warning("%s: %s failed (%s: %s); further failures are summarized", self.subject,
                                call, code, reason, extra=self._extra("down", now))
        elif (code, reason) not in self._seen:  # a new way of failing; calls alternating between two are not
            self._said = now
            self._last = (code, reason)
            self._seen.add(self._last)
            self.logger.warning("%s: still failing, now %s failed (%s: %s; %d failures in %.0f s)", self.subject, call,
                                code, reason, self.failures, now - self._since, extra=self._extra("changed", now))
        elif now - self._said >= self.still_every_s:
            self._said = now
            self.logger.warning("%s: still failing after %.0f s (%d failures; last: %s failed: %s: %s)",
                                self.subject, now - self._since, self.failures, call, code, reason,
                                extra=self._extra("still_down", now))

    def answered(self) -> None:
        """A call to the subject answered: the end of an outage, if there was one."""
        if not self.failures:
            return
        now = self.clock()
        self.logger.info("%s: %s after %.1f s (%d failed calls)", self.subject, self.back, now - self._since,
                         self.failures, extra=self._extra("back", now))
        self.failures = 0
        self._last = None
