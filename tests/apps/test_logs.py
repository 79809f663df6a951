"""``--log-format json``: one JSON object per line with the IDs a record is about, its
traceback, and nothing that breaks the stream (a lone surrogate in a message)."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from tenure.apps.logs import JsonFormatter, configure_logging


def test_a_json_line_carries_the_extra_fields_the_traceback_and_escapes_a_lone_surrogate() -> None:
    logger = logging.getLogger("test.json")
    try:
        raise ValueError("bad \udc80 byte")
    except ValueError:
        record = logger.makeRecord("test.json", logging.ERROR, __file__, 1, "job %s failed: %s", ("j-1", "bad \udc80"),
                                   sys.exc_info(), extra={"job_id": "j-1", "attempt": 2, "queue": "emails",
                                                          "odd": object()})
    line = JsonFormatter().format(record)
    line.encode("ascii")  # a strict handler can write it
    entry = json.loads(line)
    assert entry["level"] == "ERROR" and entry["logger"] == "test.json"
    assert entry["message"] == "job j-1 failed: bad \udc80"
    assert (entry["job_id"], entry["attempt"], entry["queue"]) == ("j-1", 2, "emails")
    assert entry["odd"].startswith("<object object")  # not JSON: written as text
    assert "ValueError: bad" in entry["exception"] and entry["exception"].startswith("Traceback")
    assert entry["time"].endswith("+00:00")
    assert not {"args", "msg", "exc_info", "levelno", "pathname"} & set(entry)


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_configure_logging_sends_records_to_stderr_in_the_format(
    log_format: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    stream = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stream)
    root = logging.getLogger()
    before = (list(root.handlers), root.level)
    try:
        configure_logging("WARNING", log_format)
        logging.getLogger("test.configure").info("not shown")
        logging.getLogger("test.configure").warning("shown %d", 1, extra={"run_id": "r-1"})
    finally:
        root.handlers[:] = before[0]
        root.setLevel(before[1])
    [line] = stream.getvalue().splitlines()
    if log_format == "json":
        assert json.loads(line)["run_id"] == "r-1" and json.loads(line)["message"] == "shown 1"
    else:
        assert line.endswith("WARNING test.configure: shown 1")
