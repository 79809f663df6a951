"""The error surface: a code to switch on and a short authored reason.

Callers handle codes, never message text. Every message is built from authored words
only (an error code, a reason, a field name of ours), so no identifier, token, payload,
connection string or driver text can leak through an exception, its ``repr`` or its
traceback context.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

__all__ = ["ErrorCode", "TenureError", "ConfigValidationError", "ArgumentsRefused", "is_authored_word"]


class ErrorCode(enum.Enum):
    """What kind of failure happened. Values are stable strings for logs and metrics."""

    CONFIG = "config"
    QUEUE_SUBMISSION_CONFLICT = "queue_submission_conflict"
    QUEUE_CLAIM_CONFLICT = "queue_claim_conflict"
    QUEUE_PERSISTENCE_FAILED = "queue_persistence_failed"
    ATTEMPT_PREPARE_CONFLICT = "attempt_prepare_conflict"
    ATTEMPT_PREDECESSOR_UNRESOLVED = "attempt_predecessor_unresolved"
    ATTEMPT_IDENTITY_CONFLICT = "attempt_identity_conflict"
    ATTEMPT_RESUBMIT_UNPROVEN = "attempt_resubmit_unproven"
    ATTEMPT_PERSISTENCE_FAILED = "attempt_persistence_failed"
    WORKER_SHUTDOWN_INCOMPLETE = "worker_shutdown_incomplete"
    RUN_ADMISSION_CONFLICT = "run_admission_conflict"
    RUN_ADMISSION_HELD = "run_admission_held"
    RUN_SESSION_BUSY = "run_session_busy"
    RUN_OWNER_MISMATCH = "run_owner_mismatch"
    RUN_CONTAINMENT_UNPROVEN = "run_containment_unproven"
    RUN_BROKER_FAILED = "run_broker_failed"
    RUN_PERSISTENCE_FAILED = "run_persistence_failed"
    JOB_REQUEST_CONFLICT = "job_request_conflict"
    RUN_MESSAGE_REFUSED = "run_message_refused"
    """A message to a Run that is unknown (``run_not_found``) or finished: terminal or
    being cancelled (``run_finished``). Nothing was stored."""
    RUN_MESSAGE_CONFLICT = "run_message_conflict"
    """A message ID of the Run reused for another topic or message (``message_changed``),
    or a receive key reused for another topic (``receive_changed``). Nothing was stored."""


def is_authored_word(text: str) -> bool:
    """Reasons and field names are short snake_case words we wrote, never user data."""
    return (
        0 < len(text) <= 64
        and text.isascii()
        and all(character.islower() or character.isdigit() or character in "_." for character in text)
    )


class TenureError(Exception):
    """A refusal or failure the caller must handle by ``code``.

    ``reason`` is a short snake_case word from the library (for example
    ``claim_identity_changed`` or ``unavailable``). It is asserted to be one, so a
    caller-supplied value can never be smuggled into a message.
    """

    code: ErrorCode
    reason: str

    def __init__(self, code: ErrorCode, reason: str) -> None:
        assert isinstance(code, ErrorCode), "code must be an ErrorCode"
        assert is_authored_word(reason), "reason must be an authored snake_case word"
        self.code = code
        self.reason = reason
        super().__init__(f"{code.value}: {reason}")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(code={self.code.value!r}, reason={self.reason!r})"

    def __reduce__(self) -> tuple[object, ...]:
        # Exceptions pickle their ``args`` by default, which would not rebuild this class.
        return (
            _rebuild_error,
            (type(self), self.code, self.reason, getattr(self, "fields", ()), getattr(self, "problems", ())),
        )


class ConfigValidationError(TenureError):
    """An invalid request, result, fence or configuration (code ``CONFIG``).

    ``fields`` names the offending fields (our field names, never the caller's keys) and
    ``problems`` the kinds of violation (for example ``string_too_long``).
    """

    fields: tuple[str, ...]
    problems: tuple[str, ...]

    def __init__(
        self,
        reason: str,
        *,
        fields: tuple[str, ...] = (),
        problems: tuple[str, ...] = (),
    ) -> None:
        assert all(is_authored_word(name) for name in fields), "fields must be authored names"
        assert all(is_authored_word(name) for name in problems), "problems must be authored words"
        assert len(fields) == len(problems) or not fields, "one problem per field"
        super().__init__(ErrorCode.CONFIG, reason)
        self.fields = fields
        self.problems = problems
        if fields:
            details = ", ".join(
                f"{name} ({problem})" for name, problem in zip(fields, problems, strict=True)
            )
            self.args = (f"{ErrorCode.CONFIG.value}: {reason}: {details}",)


class ArgumentsRefused(ConfigValidationError):
    """Command-line arguments a ``tenure`` command rejected, with what each named option
    takes (the hints depend on the option's declaration, so they travel with the refusal).

    Raised by every subcommand's parser and checks, ``tenure conform``'s included, and
    printed by the one refusal format of :mod:`tenure.apps.reporting`. It lives here, below
    both, because ``tenure.conformance`` (which owns ``tenure conform``) may not import the
    applications (``specs/README.md``, "Where things live")."""

    def __init__(self, *, fields: tuple[str, ...] = (), problems: tuple[str, ...],
                 hints: Mapping[str, str] | None = None, spellings: Mapping[str, str] | None = None) -> None:
        super().__init__("invalid_arguments", fields=fields, problems=problems)
        self.hints = dict(hints or {})
        self.spellings = dict(spellings or {})
        """Each field's option as the command line spells it (``--lease-seconds``)."""


def _rebuild_error(
    kind: type[TenureError],
    code: ErrorCode,
    reason: str,
    fields: tuple[str, ...],
    problems: tuple[str, ...],
) -> TenureError:
    if issubclass(kind, ConfigValidationError):
        return kind(reason, fields=fields, problems=problems)
    return kind(code, reason)
