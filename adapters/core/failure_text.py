"""A failure as tenure stores and logs it: a handler's exception made a bounded, cleaned
text (``"<ExceptionType>: <message>"``), and a stand-in exception a log line may carry.

Both workers use it (the queue's :class:`~tenure.adapters.queue.worker.Worker` and the
Run worker): a handler's message never reaches storage, a log line or a metrics
observer whole, and what is stored is what is logged.
"""

from __future__ import annotations

__all__ = ["MAX_ERROR_BYTES", "MAX_LOGGED_CHAIN", "error_text", "exception_text", "loggable_exception"]

MAX_ERROR_BYTES = 2048
"""The most UTF-8 bytes of a failure's stored text (less when the source's
``max_payload_bytes`` is smaller)."""

_CONTROL = {code: "\ufffd" for code in (*range(0x00, 0x09), 0x0B, 0x0C, *range(0x0E, 0x20), *range(0x7F, 0xA0))}
"""Control characters a stored error must not carry (tab and line breaks stay: a
message may span lines); each becomes U+FFFD."""


def error_text(text: str, max_bytes: int) -> str:
    """``text`` as a storable error: control characters (except tab and line breaks) and
    unencodable code points replaced, cut to ``max_bytes`` UTF-8 bytes (at most
    :data:`MAX_ERROR_BYTES`) on a character boundary (marked with an ellipsis)."""
    max_bytes = min(max_bytes, MAX_ERROR_BYTES)
    # Every character is at least one byte once cleaned, so what lies past the first
    # max_bytes + 1 characters is cut anyway: never clean megabytes to keep two KiB.
    cleaned = text[: max_bytes + 1].translate(_CONTROL).encode("utf-8", "replace")
    if len(cleaned) <= max_bytes:
        return cleaned.decode("utf-8")
    ellipsis = "\u2026".encode()
    return cleaned[: max(0, max_bytes - len(ellipsis))].decode("utf-8", "ignore") + ellipsis.decode()


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return "(the exception's message could not be read)"


def exception_text(error: BaseException, max_bytes: int, *, with_message: bool = True) -> str:
    """``"<ExceptionType>: <message>"`` (the type alone when the message is empty, or
    when ``with_message`` is False)."""
    if not with_message:
        return error_text(type(error).__name__, max_bytes)
    message = _message(error)
    return error_text(f"{type(error).__name__}: {message}" if message else type(error).__name__, max_bytes)


MAX_LOGGED_CHAIN = 8
"""The most exceptions of a chain (``__cause__``, ``__context__``) a logged traceback shows."""


def loggable_exception(error: BaseException, max_bytes: int, *, with_message: bool = True) -> BaseException:
    """A stand-in for ``error`` that a log line or a trace may carry: its type's name,
    its traceback's frames and its chain (causes and contexts, up to
    :data:`MAX_LOGGED_CHAIN`, each likewise), but each message cleaned and cut as a
    stored error text is (:func:`error_text`), or left out with ``with_message=False``,
    and no notes. So a handler's message reaches no output whole: a 10 MB message, an
    escape sequence or a NUL is logged as it is stored, and a message that must not be
    stored is not logged either (the frames, files and lines stay to debug with)."""
    copies: dict[int, BaseException] = {}

    def copy(original: BaseException, depth: int) -> BaseException:
        known = copies.get(id(original))
        if known is not None:
            return known
        kind = type(original)
        # A class of the same name, module and qualified name prints as the original
        # type does; the original class cannot be built safely (any constructor).
        stand_in_type: type[Exception] = type(kind.__name__, (Exception,), {"__module__": kind.__module__,
                                                                            "__qualname__": kind.__qualname__})
        message = _message(original) if with_message else ""
        stand_in = stand_in_type(error_text(message, max_bytes)) if message else stand_in_type()
        copies[id(original)] = stand_in
        stand_in.__traceback__ = original.__traceback__
        if depth < MAX_LOGGED_CHAIN:
            if original.__cause__ is not None:
                stand_in.__cause__ = copy(original.__cause__, depth + 1)
            if original.__context__ is not None:
                stand_in.__context__ = copy(original.__context__, depth + 1)
        stand_in.__suppress_context__ = original.__suppress_context__
        return stand_in

    return copy(error, 0)
