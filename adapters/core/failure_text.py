"""A failure as tenure stores and logs it: a handler's exception made a bounded, cleaned
text (``"<ExceptionType>: <message>"``), and a stand-in exception a log line may carry.

Both workers use it (the queue's :class:`~tenure.adapters.queue.worker.Worker` and the
Run worker): a handler's message never reaches storage, a log line or a metrics
observer whole, and what is stored is what is logged.
"""

from __future__ import annotations

from .text import MAX_TEXT_BYTES, clean_text

__all__ = ["MAX_ERROR_BYTES", "MAX_LOGGED_CHAIN", "error_bytes", "exception_text", "loggable_exception"]

MAX_ERROR_BYTES = MAX_TEXT_BYTES
"""The most UTF-8 bytes of a failure's stored text (less when the source's
``max_payload_bytes`` is smaller: :func:`error_bytes`)."""


def error_bytes(max_payload_bytes: int) -> int:
    """The most UTF-8 bytes of a failure's stored text on a source whose payloads hold at
    most ``max_payload_bytes``."""
    return min(max_payload_bytes, MAX_ERROR_BYTES)


def _message(error: BaseException) -> str:
    try:
        return str(error)
    except Exception:  # noqa: BLE001 - a broken __str__ must not lose the failure
        return "(the exception's message could not be read)"


def exception_text(error: BaseException, max_bytes: int, *, with_message: bool = True) -> str:
    """``"<ExceptionType>: <message>"`` (the type alone when the message is empty, or
    when ``with_message`` is False), cleaned (:func:`~tenure.adapters.core.text.clean_text`,
    line breaks kept) and cut to :func:`error_bytes` of ``max_bytes``."""
    if not with_message:
        return clean_text(type(error).__name__, error_bytes(max_bytes))
    message = _message(error)
    return clean_text(f"{type(error).__name__}: {message}" if message else type(error).__name__,
                      error_bytes(max_bytes))


MAX_LOGGED_CHAIN = 8
"""The most exceptions of a chain (``__cause__``, ``__context__``) a logged traceback shows."""


def loggable_exception(error: BaseException, max_bytes: int, *, with_message: bool = True) -> BaseException:
    """A stand-in for ``error`` that a log line or a trace may carry: its type's name,
    its traceback's frames and its chain (causes and contexts, up to
    :data:`MAX_LOGGED_CHAIN`, each likewise), but each message cleaned and cut as a
    stored error text is (:func:`~tenure.adapters.core.text.clean_text`), or left out
    with ``with_message=False``, and no notes. So a handler's message reaches no output whole: a 10 MB message, an
    escape sequence, a NUL or a bidirectional override is logged as it is stored, and a message that must not be
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
        stand_in = stand_in_type(clean_text(message, error_bytes(max_bytes))) if message else stand_in_type()
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
