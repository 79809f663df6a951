"""One table of the command line's flags: which library field each sets and what it takes.

A refusal names the library's field (``batch_size``, ``idle_wait_s``): the same
``ConfigValidationError`` a Python caller gets. On the command line the field is spelt as
the flag that set it, with what that flag accepts, from :data:`FLAGS`, the one table every
subcommand shares. A row with a ``command`` applies to that subcommand only (the demo's
tighter ranges), ahead of the general row of the same field. A field with no row (a
setting no flag reaches) is printed as it is.
"""

from __future__ import annotations

import dataclasses

from tenure.model import bounds

from tenure.adapters.queue.sources import MAX_BATCH
from tenure.adapters.queue.worker import MAX_CONCURRENCY, MAX_GRACE_S, MAX_IDLE_WAIT_S
from .demo import DEMO_LIMITS
from .health import THRESHOLD_LIMITS

__all__ = ["Flag", "FLAGS", "flag_for", "DB_URL_FORMS", "WHOLE_SETTING_PROBLEMS"]

DB_URL_SHAPES = "sqlite:///PATH or postgresql://USER@HOST/DATABASE"
DB_URL_FORMS = DB_URL_SHAPES + "; or set TENURE_DB"


@dataclasses.dataclass(frozen=True, slots=True)
class Flag:
    field: str
    """The library's name of the setting, as refusals name it."""
    flag: str
    """The command-line spelling that sets it."""
    accepts: str
    """What the flag takes, printed beside a refusal."""
    command: str | None = None
    """The subcommand this row is for (None: every one)."""


def _number(value: float) -> str:
    return f"{int(value):,}" if value == int(value) else f"{value:,g}"


def _range(low: float, high: float, unit: str = "") -> str:
    return f"{_number(low)} to {_number(high)}{unit}"


FLAGS: tuple[Flag, ...] = (
    Flag("db_url", "--db", DB_URL_FORMS),
    Flag("db_schema", "--schema", "a PostgreSQL schema name"),
    Flag("lease_seconds", "--lease-seconds",
         f"more than 0 up to {bounds.MAX_LEASE_SECONDS:,} seconds, longer than --heartbeat-seconds"),
    Flag("heartbeat_seconds", "--heartbeat-seconds", "more than 0 seconds, shorter than --lease-seconds"),
    Flag("timeout_seconds", "--timeout-seconds", f"more than 0 up to {bounds.MAX_TIMEOUT_SECONDS:,} seconds"),
    Flag("concurrency", "--concurrency", _range(1, MAX_CONCURRENCY)),
    Flag("batch_size", "--batch", _range(1, MAX_BATCH)),
    Flag("threads", "--threads", _range(1, MAX_CONCURRENCY)),
    Flag("idle_wait_s", "--idle-wait", f"more than 0 up to {MAX_IDLE_WAIT_S:,g} seconds"),
    Flag("shutdown_grace_s", "--grace-seconds", _range(0, MAX_GRACE_S, " seconds")),
    Flag("status_seconds", "--status-seconds", "more than 0 seconds"),
    Flag("worker_id", "--worker-id", "a nonempty name"),
    Flag("queues", "--queue", "a queue name (repeat for several)"),
    Flag("queue", "--queue", "tasks (default), validation, pipeline or streaming", "jobs"),
    Flag("task_queue", "--task-queue", "a task queue name: letters, digits and underscores, 1 to 63", "jobs"),
    Flag("workflows", "--workflows", "package.module:registry, a Workflows registry"),
    Flag("payload", "--payload", "a JSON object, or --payload-file PATH, or --payload - (stdin)"),
    Flag("priority", "--priority", "0 to 100 (higher first)"),
    Flag("name", "--workflow", "a workflow registered in --workflows, with --revision", "runs"),
    Flag("limit", "--limit", "1 to 10,000", "jobs"),
    Flag("limit", "--limit", "1 to 1,000", "runs"),
    Flag("node", "--node", "1 to 128 characters"),
    Flag("shutdown_deadline_s", "--shutdown-seconds", "more than 0 up to 3,600 seconds"),
    Flag("relay_interval_s", "--relay-seconds", "more than 0 up to 60 seconds"),
    Flag("node_lease_s", "--node-lease-seconds", "more than twice --relay-seconds, up to 3,600 seconds"),
    Flag("args", "--args", "a JSON object of the task's arguments"),
    Flag("payload_file", "--payload-file", "a readable file of at most 16 MiB holding a JSON object"),
    Flag("status", "--status", "a status of the listed kind (any letter case)"),
    # tenure demo's own, tighter ranges (see DEMO_LIMITS for why).
    *(Flag(field, "--" + field.replace("_", "-"), _range(low, high, " seconds" if "seconds" in field else ""), "demo")
      for field, (low, high) in DEMO_LIMITS.items()),
    Flag("seed", "--seed", "an integer", "demo"),
    Flag("db_url", "--db", DB_URL_SHAPES, "demo"),  # the demo never reads TENURE_DB
    # tenure migrate --alembic's own.
    Flag("alembic", "--alembic", "no value; not with --downgrade, --sql or --verbose", "migrate"),
    Flag("revision", "--revision", "an Alembic revision identifier: letters, digits and underscores, 1 to 32; "
         "with --alembic only", "migrate"),
    Flag("down_revision", "--down-revision", "the identifier of the revision it follows: letters, digits and "
         "underscores, 1 to 32; with --alembic only", "migrate"),
    # tenure console's own (apps/console/settings.py checks them).
    Flag("host", "--host", "an address of this machine or a host name (default 127.0.0.1); any but loopback "
         "needs --token", "console"),
    Flag("port", "--port", "0 to 65,535 (0: a free port, printed)", "console"),
    Flag("token", "--token", "at least 16 printable ASCII characters without spaces that look random (`tenure "
         "console --generate-token` prints one); required with a --host that is not loopback; or set "
         "TENURE_CONSOLE_TOKEN", "console"),
    # tenure health's thresholds (their ranges are health's own).
    *(Flag(field, "--" + field.replace("_", "-"), _range(low, high, " seconds" if "seconds" in field else ""),
           "health") for field, (low, high) in THRESHOLD_LIMITS.items()),
)

_BY_FIELD: dict[tuple[str | None, str], Flag] = {(row.command, row.field): row for row in FLAGS}
assert len(_BY_FIELD) == len(FLAGS), "one row per field and command"


WHOLE_SETTING_PROBLEMS = {"heartbeat_not_shorter_than_lease": "heartbeat_seconds"}
"""A problem of the settings as a whole (pydantic names its field ``model``), by the
setting whose flag it is spelt as."""


def flag_for(field: str, command: str | None, problem: str | None = None) -> Flag | None:
    """The row that spells ``field`` (with ``problem``) on ``command``'s command line, or None."""
    if field == "model" and problem in WHOLE_SETTING_PROBLEMS:
        field = WHOLE_SETTING_PROBLEMS[problem]
    return _BY_FIELD.get((command, field)) or _BY_FIELD.get((None, field))
