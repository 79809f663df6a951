"""A Run and its current delivery are locked in one statement, Run first, and the clock
is read after both locks; a write to both is all or nothing.

Every Run write locks the pair (``RunEngine.locked_pair``). On PostgreSQL that is
one statement (``locked_joined_sql``): a lock wait on the delivery row must happen
before the clock is read, or a decision could use a time from before the wait. Here a
second session holds the delivery row (only) until a Run write waits for it; the clock
the write decided at must not be earlier than the moment the holder let go. A mutant
whose clock counts only the Run's lock reads its time first and is caught.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import asyncpg
import pytest
from adapter_support import kind_of, raw
from polling import until

from tenure.adapters import InMemoryBroker, RunLedger
from tenure.adapters.core.store import Transaction
from tenure.adapters.postgres import statements
from tenure.adapters.runs.table import DELIVERIES_BINDING, RUNS_BINDING
from tenure.adapters.runs.engine import RunEngine
from tenure.model import RunIntent, RunStatus, TenureError, WorkflowPin

PIN = WorkflowPin("pair", "1", "sha256:" + "a" * 64)


async def decided_at_after_a_delivery_lock_wait(db_url: str) -> tuple[int, int, bool]:
    """(the clock the pair was locked at, the holder's clock when it let go, whether the
    pair read was the Run with its current delivery), in microseconds since the epoch."""
    async with RunLedger(db_url) as ledger:
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=PIN, queue="runs",
                                       priority=50)
        run_id = admission.run.run_id
        holder = await asyncpg.connect(db_url)
        try:
            transaction = holder.transaction()
            await transaction.start()
            await holder.fetch("SELECT 1 FROM tenure_run_deliveries WHERE run_id = $1 FOR UPDATE", run_id)

            async def body(tx: Transaction) -> tuple[Any, int]:
                pair = await RunEngine.locked_pair(tx, run_id)
                return pair, await tx.now_us()

            waiting = asyncio.create_task(ledger.engine.run(body))

            async def waits_for_a_lock() -> bool:
                return bool(await holder.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"))

            await until(waits_for_a_lock, what="the pair's statement waits for the delivery row")  # a hang guard
            assert not waiting.done()
            let_go = await holder.fetchval("SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint")
            await transaction.commit()
            pair, now = await waiting
        finally:
            await holder.close()
    whole = pair is not None and pair.run.run_id == run_id and pair.current.enqueue_seq == pair.run.enqueue_seq
    return now, let_go, whole


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_clock_is_read_after_the_delivery_lock(db_url: str) -> None:
    now, let_go, whole = await decided_at_after_a_delivery_lock_wait(db_url)
    assert whole
    assert now >= let_go, "the pair was decided at a time from before its delivery lock was granted"


@pytest.mark.parametrize("database", ["postgresql"])
async def test_the_mutant_that_reads_the_clock_after_the_run_lock_only_is_caught(
    db_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = statements.locked_joined_sql.__wrapped__

    def clock_after_the_first_lock(*arguments: Any) -> str:
        sql = original(*arguments)
        mutant = sql.replace("FROM (SELECT 1 FROM locked UNION ALL SELECT 1 FROM joined) AS every_lock", "FROM locked")
        assert mutant != sql
        return mutant

    monkeypatch.setattr(statements, "locked_joined_sql", clock_after_the_first_lock)
    now, let_go, whole = await decided_at_after_a_delivery_lock_wait(db_url)
    assert whole and now < let_go, "the mutant reads the clock before waiting for the delivery"


# --- a Run and its delivery written in one statement -------------------------------------


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_a_pair_written_across_its_tables_keeps_nothing_when_one_row_changed(db_url: str) -> None:
    """``write_across`` writes the Run and its delivery (on PostgreSQL in one statement
    of two UPDATEs, which both run): when the delivery is no longer the row decided on,
    the call raises ``row_changed`` and the Run's write goes with the rolled-back
    transaction."""
    async with RunLedger(db_url) as ledger:
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=PIN, queue="runs",
                                       priority=50)
        run_id = admission.run.run_id
        before = await ledger.get(run_id)

        async def body(tx: Transaction) -> None:
            pair = await RunEngine.locked_pair(tx, run_id)
            assert pair is not None
            run, delivery = pair.run, pair.current
            stale = dataclasses.replace(delivery, last_error="not what is stored")
            await tx.write_across([
                (RUNS_BINDING, run, dataclasses.replace(run, node="written-then-undone")),
                (DELIVERIES_BINDING, stale, dataclasses.replace(delivery, publish_attempts=7)),
            ])

        with pytest.raises(TenureError) as raised:
            await ledger.engine.run(body)
        assert raised.value.reason == "row_changed"
        after = await ledger.get(run_id)
        assert after == before and after.node is None
        assert (await ledger.get_delivery(run_id, 0)).publish_attempts == 0


# --- a checkpoint locked with its Run ----------------------------------------------------


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
async def test_an_unreadable_checkpoint_matters_only_to_the_hop_holding_its_run(db_url: str) -> None:
    """A hop's snapshot is locked with its Run in one statement. A checkpoint another
    writer broke raises ``corrupt_row`` for the hop that holds the Run (as reading it
    after the fence did), a hop that does not hold it is answered False, and the settle
    deletes it unread: it belongs to a terminal Run."""
    async with RunLedger(db_url) as ledger:
        admission = await ledger.admit(RunIntent(None, "api", "alice", frozenset(), {}), workflow=PIN, queue="runs",
                                       priority=50)
        run_id = admission.run.run_id
        assert await ledger.publish(run_id, 0, InMemoryBroker())
        assert await ledger.claim(run_id, 0, node="node-a") is not None
        assert await ledger.checkpoints.save(run_id, 0, state={"step": 1}) is True
        unreadable = "'infinity'" if kind_of(db_url) == "postgresql" else "'not an instant'"
        raw(db_url, f"UPDATE tenure_run_checkpoints SET saved_at = {unreadable} WHERE run_id = ?", (run_id,))
        with pytest.raises(TenureError) as raised:
            await ledger.checkpoints.save(run_id, 0, state={"step": 2})
        assert raised.value.reason == "corrupt_row"
        assert await ledger.checkpoints.save(run_id, 1, state={"step": 2}) is False  # not the holding hop
        assert await ledger.settle(run_id, 0, RunStatus.DONE) is True
        assert raw(db_url, "SELECT count(*) FROM tenure_run_checkpoints WHERE run_id = ?", (run_id,)) == [(0,)]
