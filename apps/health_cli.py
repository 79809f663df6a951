"""``tenure health``: is this database reachable, migrated and keeping up? For people and
for container probes.

    tenure health [--db URL] [--json] [--timeout-seconds S]
                  [--max-pending-jobs N] [--max-oldest-pending-seconds S]
                  [--max-expired-claims N] [--expired-claim-grace-seconds S]
                  [--max-cancelling-seconds S] [--max-degraded-nodes N]

``--db`` defaults to the ``TENURE_DB`` environment variable (so a password need not sit on
the command line); the URL is never printed. The checks, their thresholds and defaults
are :mod:`tenure.apps.health`'s: ``reachable``, ``migrated``, ``pending_jobs``
(no limit unless ``--max-pending-jobs``), ``oldest_pending_seconds`` (300),
``expired_claims`` (0, past a grace of 60 s), ``oldest_cancelling_seconds`` (300) and
``recovery_reports`` (0 degraded nodes).

Output: one line per check (``name: ok|FAIL (reason), value V, threshold T; detail``)
and a last line with the verdict; with ``--json``, one JSON object (``healthy``,
``database``, ``checks``: each with ``name``, ``ok``, ``value``, ``threshold``,
``reason`` and ``detail``; ``queues``: the depth of each queue by status).

Exit status: 0 healthy; 1 unhealthy, including a database that failed or did not answer
within ``--timeout-seconds`` (default 5: the command never hangs); 2 refused: bad
arguments, or a database ``tenure migrate`` never ran on (as ``tenure worker`` refuses it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from .health import (
    DEFAULT_TIMEOUT_SECONDS,
    THRESHOLD_LIMITS,
    HealthCheck,
    HealthSnapshot,
    Thresholds,
    check_setting,
    health_snapshot,
)
from .worker_cli import refuse_never_migrated

__all__ = ["add_health_parser", "run_health", "check_line", "setting_range"]

_DEFAULTS = Thresholds()


def add_health_parser(commands: Any) -> None:
    health = commands.add_parser(
        "health", help="check that a database is reachable, migrated and keeping up (exit 0 healthy, 1 unhealthy, "
                       "2 refused)")
    health.add_argument("--db", default=None, help="database URL (default: $TENURE_DB)")
    health.set_defaults(database_required=True)
    health.add_argument("--json", action="store_true", help="print one JSON object instead of one line per check")

    health.add_argument("--timeout-seconds", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                        help=f"how long the whole check may take ({setting_range('timeout_seconds')}, default "
                             f"{DEFAULT_TIMEOUT_SECONDS:g}); a database that does not answer in time is unhealthy")
    health.add_argument("--max-pending-jobs", type=int, default=None,
                        help="most pending jobs over every queue "
                             f"({setting_range('max_pending_jobs')}; default: no limit)")
    health.add_argument("--max-oldest-pending-seconds", type=float, default=_DEFAULTS.max_oldest_pending_seconds,
                        help=f"longest a due pending job may wait ({setting_range('max_oldest_pending_seconds')}, "
                             f"default {_DEFAULTS.max_oldest_pending_seconds:g})")
    health.add_argument("--max-expired-claims", type=int, default=_DEFAULTS.max_expired_claims,
                        help="most claims past their lease (and the grace) "
                             f"({setting_range('max_expired_claims')}, default {_DEFAULTS.max_expired_claims})")
    health.add_argument("--expired-claim-grace-seconds", type=float, default=_DEFAULTS.expired_claim_grace_seconds,
                        help="how long past its lease a claim counts as expired "
                             f"({setting_range('expired_claim_grace_seconds')}, "
                             f"default {_DEFAULTS.expired_claim_grace_seconds:g})")
    health.add_argument("--max-cancelling-seconds", type=float, default=_DEFAULTS.max_cancelling_seconds,
                        help=f"longest a Run may stay in CANCELLING ({setting_range('max_cancelling_seconds')}, "
                             f"default {_DEFAULTS.max_cancelling_seconds:g})")
    health.add_argument("--max-degraded-nodes", type=int, default=_DEFAULTS.max_degraded_nodes,
                        help="most nodes whose latest recovery report is degraded "
                             f"({setting_range('max_degraded_nodes')}, default {_DEFAULTS.max_degraded_nodes})")


def _bound(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def setting_range(field: str) -> str:
    """The range a setting takes, as its flag's help and refusal say it."""
    low, high = THRESHOLD_LIMITS[field]
    return f"{_bound(low)} to {_bound(high)}"


def _settings(arguments: argparse.Namespace) -> dict[str, Any]:
    """Every setting, each checked against its range (the refusal names its flag's range)."""
    settings = {field: getattr(arguments, field) for field in THRESHOLD_LIMITS}
    for field, value in settings.items():
        if value is None and field == "max_pending_jobs":
            continue
        check_setting(field, value)  # its refusal is spelt as the flag, with its range (flags.FLAGS)
    return settings


def _number(value: int | float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _detail(detail: Any) -> str:
    parts = []
    for name, value in detail.items():
        if isinstance(value, dict):
            if value:
                parts.append(f"{name} " + ", ".join(f"{key} {_number(count)}" for key, count in value.items()))
        elif isinstance(value, list):
            if value:
                parts.append(f"{name} " + ", ".join(str(item) for item in value))
        elif value is not None:
            parts.append(f"{name} {_number(value)}")
    return "; ".join(parts)


def check_line(check: HealthCheck) -> str:
    """One check as one line: ``name: ok|FAIL (reason), value V, threshold T; detail``."""
    line = f"{check.name}: {'ok' if check.ok else 'FAIL'} ({check.reason})"
    if check.value is not None:
        line += f", value {_number(check.value)}"
    if check.threshold is not None:
        line += f", threshold {_number(check.threshold)}"
    detail = _detail(check.detail)
    return line + (f"; {detail}" if detail else "")


def _print(snapshot: HealthSnapshot, as_json: bool) -> None:
    if as_json:
        print(json.dumps(snapshot.document(), indent=2))
        return
    for check in snapshot.checks:
        print(check_line(check))
    failed = sum(not check.ok for check in snapshot.checks)
    print(f"healthy ({snapshot.database})" if snapshot.healthy
          else f"unhealthy: {failed} of {len(snapshot.checks)} checks failed ({snapshot.database})")


def run_health(arguments: argparse.Namespace) -> int:
    db_url = arguments.db  # --db, else TENURE_DB: cli.with_database filled it or refused the command
    settings = _settings(arguments)  # every argument is checked before the database is touched
    timeout_seconds = settings.pop("timeout_seconds")
    snapshot = asyncio.run(health_snapshot(db_url, thresholds=Thresholds(**settings), timeout_seconds=timeout_seconds))
    if snapshot.never_migrated is not None:
        return refuse_never_migrated(snapshot.never_migrated, "tenure health")
    _print(snapshot, arguments.json)
    return 0 if snapshot.healthy else 1
