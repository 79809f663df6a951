"""An idempotency key names one admission, whatever the source (seed 004: key reuse for
different work fails closed), and Runs admitted before ``runs_v4`` keep their
source-scoped IDs: a replay of their key and intent finds them.

Two kinds of old database: ``tests/support/data/runs_before_v4.db``, written by the release
before ``runs_v4`` itself (see ``tests/support/data/write_runs_before_v4.py``), and, on every
database, Runs this ledger admits under the old derivation of the ID.
"""

from __future__ import annotations

import asyncio
import pathlib
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from adapter_support import raw
from run_support import PIN, Runs, runs_db, unique  # noqa: F401 (runs_db: fixture)
import paths
from tenure.adapters import RunLedger, upgrade
from tenure.adapters.runs import engine as engine_module
from tenure.adapters.runs import ledger as ledger_module
from tenure.adapters.runs.ledger import legacy_run_id_for, run_id_for
from tenure.kernel.runs.aggregate import Evidence
from tenure.model import ErrorCode, RunIntent, TenureError

OLD_DATABASE = paths.SUPPORT / "data" / "runs_before_v4.db"


def intent(source: str, payload: object) -> RunIntent:
    return RunIntent(session_id=None, source=source, principal="alice", scopes=frozenset({"files:read"}),
                     payload=payload)


async def admit(ledger: RunLedger, source: str, payload: object, key: str, **options: Any) -> Any:
    options = {"queue": "runs", "priority": 50, **options}
    return await ledger.admit(intent(source, payload), workflow=PIN, idempotency_key=key, **options)


async def refused(call: Any) -> TenureError:
    with pytest.raises(TenureError) as caught:
        await call
    assert caught.value.code is ErrorCode.RUN_ADMISSION_CONFLICT, caught.value
    return caught.value


# --- a database the release before runs_v4 wrote -------------------------------------


@pytest.fixture
def old_database(tmp_path: pathlib.Path) -> Iterator[str]:
    copy = tmp_path / "old.db"
    shutil.copyfile(OLD_DATABASE, copy)
    yield f"sqlite:///{copy}"


def count_runs(db_url: str) -> int:
    return int(raw(db_url, "SELECT count(*) FROM tenure_runs")[0][0])


async def test_a_database_written_before_runs_v4_upgrades_and_its_admissions_replay_to_their_runs(
    old_database: str,
) -> None:
    stored = {(source, key): run_id for run_id, source, key in
              raw(old_database, "SELECT run_id, source, idempotency_key FROM tenure_runs")}
    assert stored == {(source, key): legacy_run_id_for(source, key)
                      for source, key in [("api", "order-1"), ("cli", "order-1"), ("api", "order-2"),
                                          ("api", "order-3")]}
    report = await upgrade(old_database)
    assert report.applied == ("runs_v4", "runs_v5", "tasks_v1", "runs_v6", "console_v1", "versions_v1", "attempts_v2", "runs_v7", "runs_v8", "workers_v1")
    async with RunLedger(old_database) as ledger:
        for (source, key), run_id in stored.items():
            order = int(key.removeprefix("order-"))
            options: dict[str, Any] = {"priority": 60 - 10 * order} if order > 1 else {}
            replay = await admit(ledger, source, {"order": order}, key, hold=(key == "order-2"), **options)
            assert replay.created is False and replay.run.run_id == run_id and replay.run.source == source
        # Reusing an old key for different work, from a new source included, is refused.
        await refused(admit(ledger, "web", {"order": 1}, "order-1"))
        await refused(admit(ledger, "cli", {"order": 3}, "order-3", priority=30))
        await refused(admit(ledger, "api", {"order": 99}, "order-3", priority=30))
        assert count_runs(old_database) == 4
        fresh = await admit(ledger, "api", {"order": 4}, "order-4")
        assert fresh.created is True and fresh.run.run_id == run_id_for("order-4")
        assert count_runs(old_database) == 5


# --- on every database: Runs admitted under the old derivation -----------------------


async def admit_before_runs_v4(ledger: RunLedger, monkeypatch: pytest.MonkeyPatch, source: str, key: str) -> str:
    """Admit as the ledger did before runs_v4: the same transaction, the ID scoped by
    source, and no look-up of the key."""

    async def meets_nothing(*_: Any) -> None:
        return None

    with monkeypatch.context() as patched:
        patched.setattr(ledger_module, "run_id_for", lambda k: legacy_run_id_for(source, k))
        patched.setitem(engine_module.READERS, Evidence.KEY_HOLDER, meets_nothing)
        admission = await admit(ledger, source, {"n": 1}, key)
    assert admission.run.run_id == legacy_run_id_for(source, key) != run_id_for(key)
    return admission.run.run_id


@pytest.fixture
async def ledger(runs_db: str) -> Any:
    async with RunLedger(runs_db) as made:
        yield made


async def test_a_run_admitted_under_a_source_scoped_id_is_found_by_its_key_and_not_duplicated(
    ledger: RunLedger, runs_db: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, source = unique("key"), unique("api")
    old_id = await admit_before_runs_v4(ledger, monkeypatch, source, key)
    replay = await admit(ledger, source, {"n": 1}, key)
    assert replay.created is False and replay.run.run_id == old_id
    error = await refused(admit(ledger, unique("cli"), {"n": 1}, key))
    assert error.reason == "intent_changed"
    assert raw(runs_db, "SELECT run_id FROM tenure_runs WHERE idempotency_key = ?", (key,)) == [(old_id,)]


async def test_of_two_runs_once_admitted_under_one_key_a_replay_meets_its_own_sources(
    ledger: RunLedger, monkeypatch: pytest.MonkeyPatch,
) -> None:
    key, first, second = unique("key"), unique("api"), unique("cli")
    first_id = await admit_before_runs_v4(ledger, monkeypatch, first, key)
    second_id = await admit_before_runs_v4(ledger, monkeypatch, second, key)
    assert (await admit(ledger, first, {"n": 1}, key)).run.run_id == first_id
    assert (await admit(ledger, second, {"n": 1}, key)).run.run_id == second_id
    await refused(admit(ledger, unique("web"), {"n": 1}, key))


async def test_one_key_admitted_from_two_sources_at_once_makes_one_run_and_one_conflict(runs_db: str) -> None:
    key = unique("key")
    ledgers = [RunLedger(runs_db) for _ in range(2)]

    async def attempt(ledger: RunLedger, source: str) -> Any:
        try:
            return (await admit(ledger, source, {"n": 1}, key)).created
        except TenureError as error:
            return error.code

    try:
        outcomes = await asyncio.gather(attempt(ledgers[0], unique("api")), attempt(ledgers[1], unique("cli")))
    finally:
        for ledger in ledgers:
            await ledger.close()
    assert sorted(outcomes, key=str) == sorted([True, ErrorCode.RUN_ADMISSION_CONFLICT], key=str)
    assert raw(runs_db, "SELECT count(*) FROM tenure_runs WHERE idempotency_key = ?", (key,)) == [(1,)]
