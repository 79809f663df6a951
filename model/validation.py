"""Field checks shared by every public model, and the bridge from pydantic's errors to ours.

Each check is a plain function that returns the accepted value or raises
``PydanticCustomError`` with an authored problem code. pydantic calls them through
``PlainValidator``, so pydantic's own coercions never run: what the caller passed is
exactly what is checked. :func:`config_error_from` turns a pydantic ``ValidationError``
into a :class:`ConfigValidationError` that names our fields and problem codes only;
pydantic's messages quote the input, so none of their text is kept.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import threading
from collections.abc import Callable
from typing import Annotated, Any, overload

from pydantic import BaseModel, PlainValidator, ValidationError
from pydantic_core import PydanticCustomError

from . import bounds
from .errors import ConfigValidationError
from .json_values import JsonProblem, freeze_json, text_problem

__all__ = [
    "refuse",
    "backoff_seconds",
    "IdentityText",
    "JobIdText",
    "RunIdText",
    "ContractNameText",
    "ContractVersionText",
    "ConfigNameText",
    "ConfigVersionText",
    "NonEmptyText",
    "QueueNameText",
    "TaskNameText",
    "Priority",
    "is_queue_name",
    "PositiveInt32",
    "AwareDatetime",
    "JsonObject",
    "StringMap",
    "StrictBool",
    "PositiveSeconds",
    "TimeoutSeconds",
    "PayloadBytes",
    "NonNegativeMs",
    "take_canonical_text",
    "StrictModel",
    "config_error_from",
    "datetime_to_micros",
    "micros_to_datetime",
    "EPOCH",
]


def refuse(field: str, problem: str, *, reason: str | None = None) -> ConfigValidationError:
    """The refusal of one field's value: ``ConfigValidationError`` naming the field and its
    problem code, with the reason ``invalid_<field>`` unless one is given. Every facade
    raises its input refusals through here, so they read alike."""
    return ConfigValidationError(reason or f"invalid_{field}", fields=(field,), problems=(problem,))


def backoff_seconds(value: object, field: str, *, reason: str | None = None) -> float:
    """A number of seconds from 0 to a year (a backoff's bound, ``MAX_BACKOFF_MS``): a
    task's delay or backoff, a claim given back for later; else the refusal of ``field``
    (``number_required``, ``number_out_of_range``)."""
    if type(value) not in (int, float):
        raise refuse(field, "number_required", reason=reason)
    try:
        seconds = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int too large for a float
        seconds = math.inf
    if not math.isfinite(seconds) or not 0 <= seconds <= bounds.MAX_BACKOFF_MS / 1000:
        raise refuse(field, "number_out_of_range", reason=reason)
    return seconds


def _refuse(problem: str) -> PydanticCustomError:
    return PydanticCustomError(problem, problem.replace("_", " "))


def _check_text(value: object, max_chars: int) -> str:
    if type(value) is not str:
        raise _refuse("string_required")
    if not value:
        raise _refuse("string_empty")
    if len(value) > max_chars:
        raise _refuse("string_too_long")
    problem = text_problem(value)
    if problem is not None:
        raise _refuse(problem)
    return value


def _text_check(max_chars: int) -> Callable[[object], str]:
    return lambda value: _check_text(value, max_chars)


# Nonempty strings of bounded length, kept exactly as given (never trimmed or folded).
IdentityText = Annotated[str, PlainValidator(_text_check(bounds.MAX_IDENTITY_CHARS))]
JobIdText = Annotated[str, PlainValidator(_text_check(bounds.MAX_JOB_ID_CHARS))]
RunIdText = Annotated[str, PlainValidator(_text_check(bounds.MAX_RUN_ID_CHARS))]
ContractNameText = Annotated[str, PlainValidator(_text_check(bounds.MAX_CONTRACT_NAME_CHARS))]
ContractVersionText = Annotated[str, PlainValidator(_text_check(bounds.MAX_CONTRACT_VERSION_CHARS))]
ConfigNameText = Annotated[str, PlainValidator(_text_check(bounds.MAX_CONFIG_NAME_CHARS))]
ConfigVersionText = Annotated[str, PlainValidator(_text_check(bounds.MAX_CONFIG_VERSION_CHARS))]
NonEmptyText = Annotated[str, PlainValidator(_text_check(10**9))]

_QUEUE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,%d}" % (bounds.MAX_QUEUE_NAME_CHARS - 1))
_TASK_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.:][A-Za-z_][A-Za-z0-9_]*)*")


def is_queue_name(value: object) -> bool:
    """An ASCII identifier of at most 63 characters (letters, digits, underscores; not
    starting with a digit): safe in every log line, metric label and channel name."""
    return type(value) is str and _QUEUE_NAME.fullmatch(value) is not None


def _check_queue_name(value: object) -> str:
    if type(value) is not str:
        raise _refuse("string_required")
    if not is_queue_name(value):
        raise _refuse("identifier_required")
    return value


def _check_task_name(value: object) -> str:
    if type(value) is not str:
        raise _refuse("string_required")
    if len(value) > bounds.MAX_TASK_NAME_CHARS:
        raise _refuse("string_too_long")
    if _TASK_NAME.fullmatch(value) is None:
        raise _refuse("dotted_identifier_required")
    return value


QueueNameText = Annotated[str, PlainValidator(_check_queue_name)]
"""A task queue's name (see :func:`is_queue_name`)."""
TaskNameText = Annotated[str, PlainValidator(_check_task_name)]
"""A task's name: identifiers joined by ``.`` or ``:`` (``billing.send_invoice``), at most
255 characters."""


def _check_priority(value: object) -> int:
    if not bounds.is_strict_int(value):
        raise _refuse("integer_required")
    if not 0 <= value <= bounds.MAX_PRIORITY:  # type: ignore[operator]
        raise _refuse("integer_out_of_range")
    return value  # type: ignore[return-value]


Priority = Annotated[int, PlainValidator(_check_priority)]
"""0..100; a higher priority is claimed first."""


def _check_positive_int32(value: object) -> int:
    if not bounds.is_strict_int(value):
        raise _refuse("integer_required")
    if not 1 <= value <= bounds.INT32_MAX:  # type: ignore[operator]
        raise _refuse("integer_out_of_range")
    return value  # type: ignore[return-value]


PositiveInt32 = Annotated[int, PlainValidator(_check_positive_int32)]


EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
"""The Unix epoch: every stored instant counts microseconds from it."""


def datetime_to_micros(value: dt.datetime) -> int:
    """Microseconds since the Unix epoch of an aware datetime."""
    delta = value - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@overload
def micros_to_datetime(micros: int) -> dt.datetime: ...
@overload
def micros_to_datetime(micros: int | None) -> dt.datetime | None: ...
def micros_to_datetime(micros: int | None) -> dt.datetime | None:
    """A stored instant (microseconds since the Unix epoch) as an aware UTC datetime
    (None stays None)."""
    return None if micros is None else EPOCH + dt.timedelta(microseconds=micros)


def _check_aware_datetime(value: object) -> dt.datetime:
    if type(value) is not dt.datetime:
        raise _refuse("datetime_required")
    try:
        offset = value.utcoffset()
        value.astimezone(dt.timezone.utc)
    except (OverflowError, ValueError, TypeError, ArithmeticError):
        raise _refuse("datetime_out_of_range") from None
    if offset is None:
        raise _refuse("timezone_required")
    return value


AwareDatetime = Annotated[dt.datetime, PlainValidator(_check_aware_datetime)]


_CANONICAL = threading.local()


def take_canonical_text(copy: object) -> str | None:
    """The canonical text computed when ``copy`` was validated (once; see StrictModel)."""
    texts: dict[int, str] = getattr(_CANONICAL, "texts", {})
    return texts.pop(id(copy), None)


def _check_json_object(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _refuse("json_object_required")
    try:
        copy, text = freeze_json(value)
    except JsonProblem as problem:
        raise _refuse(problem.code) from None
    # Keep the canonical text for the model being built (model_post_init collects it), so
    # fingerprinting it later need not encode a large payload again.
    if not hasattr(_CANONICAL, "texts"):
        _CANONICAL.texts = {}
    _CANONICAL.texts[id(copy)] = text
    return copy  # type: ignore[no-any-return]


JsonObject = Annotated[dict[str, Any], PlainValidator(_check_json_object)]


def _check_string_map(value: object) -> dict[str, str]:
    if type(value) is not dict:
        raise _refuse("string_map_required")
    for key, item in value.items():
        if type(key) is not str or type(item) is not str:
            raise _refuse("string_values_required")
        problem = text_problem(key) or text_problem(item)
        if problem is not None:
            raise _refuse(problem)
    return dict(value)


StringMap = Annotated[dict[str, str], PlainValidator(_check_string_map)]


def _check_strict_bool(value: object) -> bool:
    if type(value) is not bool:
        raise _refuse("boolean_required")
    return value


StrictBool = Annotated[bool, PlainValidator(_check_strict_bool)]


def _seconds_check(max_seconds: float) -> Callable[[object], float]:
    def check(value: object) -> float:
        if type(value) not in (int, float):
            raise _refuse("number_required")
        # An int is compared as an int: a huge one (10**400) cannot become a float, and
        # math.isfinite would raise OverflowError on it instead of refusing it.
        in_range = (
            0 < value <= max_seconds
            if type(value) is int
            else math.isfinite(value) and 0 < value <= max_seconds  # type: ignore[arg-type, operator]
        )
        if not in_range:
            raise _refuse("number_out_of_range")
        return value  # type: ignore[return-value]

    return check


PositiveSeconds = Annotated[float, PlainValidator(_seconds_check(bounds.MAX_LEASE_SECONDS))]
TimeoutSeconds = Annotated[float, PlainValidator(_seconds_check(bounds.MAX_TIMEOUT_SECONDS))]


def _check_payload_bytes(value: object) -> int:
    if not bounds.is_strict_int(value):
        raise _refuse("integer_required")
    if not 1 <= value <= bounds.MAX_PAYLOAD_BYTES_LIMIT:  # type: ignore[operator]
        raise _refuse("integer_out_of_range")
    return value  # type: ignore[return-value]


PayloadBytes = Annotated[int, PlainValidator(_check_payload_bytes)]


def _check_non_negative_ms(value: object) -> int:
    if not bounds.is_strict_int(value):
        raise _refuse("integer_required")
    if not 0 <= value <= bounds.MAX_BACKOFF_MS:  # type: ignore[operator]
        raise _refuse("integer_out_of_range")
    return value  # type: ignore[return-value]


NonNegativeMs = Annotated[int, PlainValidator(_check_non_negative_ms)]


def _authored(word: object, fallback: str) -> str:
    text = str(word)
    ok = 0 < len(text) <= 64 and text.isascii() and all(c.islower() or c.isdigit() or c == "_" for c in text)
    return text if ok else fallback


def config_error_from(model: type[BaseModel], error: ValidationError) -> ConfigValidationError:
    """Our error for a pydantic failure: field names of ours and problem codes only."""
    known_fields = set(model.model_fields)
    fields: list[str] = []
    problems: list[str] = []
    for detail in error.errors(include_input=False, include_url=False, include_context=False):
        location = detail.get("loc", ())
        head = location[0] if location else None
        if head is None:
            field = "model"  # a check across fields (for example heartbeat vs lease)
        elif isinstance(head, str) and head in known_fields:
            field = head
        else:
            field = "unknown_field"  # never the caller's key: it is their text
        fields.append(_authored(field, "unknown_field"))
        problems.append(_authored(detail.get("type", "invalid"), "invalid"))
    return ConfigValidationError(
        f"invalid_{_snake(model.__name__)}", fields=tuple(fields), problems=tuple(problems)
    )


def _snake(name: str) -> str:
    out = []
    for index, character in enumerate(name):
        if character.isupper() and index:
            out.append("_")
        out.append(character.lower())
    return "".join(out)


class StrictModel(BaseModel):
    """Frozen, closed models whose construction raises ConfigValidationError.

    The pydantic error is converted outside its ``except`` block so that no exception
    context (which quotes the input) is attached to the error the caller sees.
    """

    model_config = {"frozen": True, "extra": "forbid", "strict": True, "revalidate_instances": "always"}

    def __init__(self, /, **data: Any) -> None:
        failure: ValidationError | None = None
        try:
            super().__init__(**data)
        except ValidationError as error:
            failure = error
        if failure is not None:
            raise config_error_from(type(self), failure)

    @classmethod
    def checked(cls, builder: Callable[[], Any]) -> Any:
        """Run ``builder`` and convert a pydantic failure into ConfigValidationError."""
        failure: ValidationError | None = None
        try:
            return builder()
        except ValidationError as error:
            failure = error
        raise config_error_from(cls, failure)
