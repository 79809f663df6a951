"""Writes ``runs_before_v4.db``: a SQLite database migrated and written by tenure as it was
before schema step ``runs_v4`` (commit 1c69948, Run IDs scoped by source). Run it with
that release installed, never with the current code::

    python tests/support/data/write_runs_before_v4.py tests/support/data/runs_before_v4.db

tests/adapters/runs/test_run_admission_keys.py upgrades a copy and replays these admissions.
"""

from __future__ import annotations

import asyncio
import sys

from tenure.adapters import RunLedger, upgrade
from tenure.model import RunIntent, WorkflowPin

PIN = WorkflowPin("review", "rev-1", "sha256:" + "a" * 64)


def intent(source: str, payload: object) -> RunIntent:
    return RunIntent(session_id=None, source=source, principal="alice", scopes=frozenset({"files:read"}),
                     payload=payload)


async def main(path: str) -> None:
    url = f"sqlite:///{path}"
    await upgrade(url)
    ledger = RunLedger(url)
    try:
        # The defect this step mends: one key admitted from two sources made two Runs.
        await ledger.admit(intent("api", {"order": 1}), workflow=PIN, queue="runs", priority=50,
                           idempotency_key="order-1")
        await ledger.admit(intent("cli", {"order": 1}), workflow=PIN, queue="runs", priority=50,
                           idempotency_key="order-1")
        await ledger.admit(intent("api", {"order": 2}), workflow=PIN, queue="runs", priority=40,
                           idempotency_key="order-2", hold=True)
        await ledger.admit(intent("api", {"order": 3}), workflow=PIN, queue="runs", priority=30,
                           idempotency_key="order-3")
    finally:
        await ledger.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
