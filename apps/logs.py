"""How the long-running commands log: ``--log-level`` and ``--log-format json|text``.

``text`` (the default) is one human line per record on stderr::

    2026-12-05 13:40:01,123 ERROR tenure.adapters.queue.worker: job 0193... (task send on queue emails, ...

``json`` is one JSON object per line, for a log pipeline: ``time`` (UTC, ISO 8601 with
milliseconds), ``level``, ``logger``, ``message``, then every ``extra`` field the line
carries (the IDs it is about: ``job_id``, ``queue``, ``task``, ``attempt``,
``generation``, ``worker_id``, ``run_id``, ``workflow``, ``seq``, ``node``, ``outcome``,
and an outage's ``outage``, ``failures``, ``down_s``), and ``exception`` (the formatted
traceback) when the record has one. Values JSON cannot hold are written as text, and
text that is not valid Unicode (a lone surrogate in an exception's message) is escaped,
so a record never breaks the stream.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
from typing import Any

__all__ = ["JsonFormatter", "configure_logging", "add_logging_options", "LOG_FORMATS", "TEXT_FORMAT"]

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")

_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
"""The attributes every LogRecord has: anything else on a record came in ``extra``."""


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in entry:
                entry[name] = _plain(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        # ensure_ascii escapes every non-ASCII code point, lone surrogates included.
        return json.dumps(entry, ensure_ascii=True, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """Send the root logger's records to stderr at ``level`` in ``log_format``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


def add_logging_options(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` and ``--log-format``, alike on every long-running command."""
    parser.add_argument("--log-level", default="INFO", type=str.upper, choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                        help="least severe level logged (default INFO)")
    parser.add_argument("--log-format", default="text", type=str.lower, choices=list(LOG_FORMATS),
                        help="text: one line per record; json: one JSON object per line with the IDs each "
                             "record is about (default text)")
