"""``defer(using=...)``: a task written in the caller's own transaction commits or rolls
back with the caller's data, on both databases, through the driver's connection
(asyncpg, aiosqlite) and through SQLAlchemy's ``AsyncConnection`` and ``AsyncSession``."""

from __future__ import annotations

import contextlib
import datetime as dt
import urllib.parse
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiosqlite
import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from tenure.adapters import TaskApp, TaskContext
from tenure.model import ConfigValidationError, JobStatus

CREATE_ORDERS = "CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, item TEXT NOT NULL)"


def _sqlite_path(db_url: str) -> str:
    return urllib.parse.urlsplit(db_url).path


def _sqlalchemy_url(db_url: str) -> str:
    if db_url.startswith("sqlite"):
        return "sqlite+aiosqlite:///" + _sqlite_path(db_url)
    return "postgresql+asyncpg://" + db_url.split("://", 1)[1]


@contextlib.asynccontextmanager
async def driver_transaction(db_url: str) -> AsyncIterator[tuple[Any, Callable[[int], Any], Any, Any]]:
    """(connection, insert-an-order, commit, rollback) on the driver's own connection."""
    if db_url.startswith("sqlite"):
        connection = await aiosqlite.connect(_sqlite_path(db_url), isolation_level=None)
        try:
            await connection.execute(CREATE_ORDERS)
            await connection.execute("BEGIN")
            yield (connection, lambda n: connection.execute("INSERT INTO orders (id, item) VALUES (?, 'x')", (n,)),
                   lambda: connection.execute("COMMIT"), lambda: connection.execute("ROLLBACK"))
        finally:
            await connection.close()
        return
    connection = await asyncpg.connect(db_url)
    try:
        await connection.execute(CREATE_ORDERS)
        transaction = connection.transaction()
        await transaction.start()
        yield (connection, lambda n: connection.execute("INSERT INTO orders (id, item) VALUES ($1, 'x')", n),
               transaction.commit, transaction.rollback)
    finally:
        await connection.close()


async def orders(db_url: str) -> list[int]:
    engine = create_async_engine(_sqlalchemy_url(db_url))
    try:
        async with engine.connect() as connection:
            return [row[0] for row in await connection.execute(text("SELECT id FROM orders ORDER BY id"))]
    finally:
        await engine.dispose()


def make_app(db_url: str) -> tuple[TaskApp, Any]:
    app = TaskApp(db_url)

    @app.task(queue="orders", name="confirm_order")
    async def confirm_order(ctx: TaskContext, order_id: int) -> dict[str, int]:
        return {"confirmed": order_id}

    return app, confirm_order


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "rolled-back"])
async def test_a_task_deferred_in_the_drivers_transaction_shares_its_fate(db_url: str, commit: bool) -> None:
    app, confirm_order = make_app(db_url)
    async with app:
        async with driver_transaction(db_url) as (connection, insert, do_commit, do_rollback):
            await insert(1)
            job_id = await confirm_order.defer(order_id=1, using=connection, submission_id="order-1")
            ids = await confirm_order.defer_many([{"order_id": 2}, {"order_id": 3}], using=connection)
            await insert(2)
            if db_url.startswith("postgresql"):
                # The connection's own codecs are back: instants are datetimes, JSON is text.
                assert isinstance(await connection.fetchval("SELECT now()"), dt.datetime)
                assert await connection.fetchval("""SELECT '{"a": 1}'::json""") == '{"a": 1}'

                # Not committed yet: another connection neither sees nor claims it. (On
                # SQLite the open write transaction holds the one write lock: another
                # connection's first open waits for it.)
                assert await app.result(job_id) is None
            await (do_commit() if commit else do_rollback())
        stats = await app.worker(idle_wait_s=0.1).run_until_idle()
        if commit:
            assert await orders(db_url) == [1, 2]
            assert stats.completed == 3
            outcome = await app.result(job_id)
            assert outcome is not None and outcome.status is JobStatus.COMPLETED and outcome.result == {"confirmed": 1}
            for other in ids:
                finished = await app.result(other)
                assert finished is not None and finished.ok
        else:
            assert await orders(db_url) == []
            assert stats.claimed == 0
            assert await app.source.list_tasks() == []


@pytest.mark.parametrize("commit", [True, False], ids=["committed", "rolled-back"])
@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_a_task_deferred_through_sqlalchemy_shares_the_transactions_fate(db_url: str, commit: bool, kind: str) -> None:
    app, confirm_order = make_app(db_url)
    engine = create_async_engine(_sqlalchemy_url(db_url))
    try:
        async with engine.begin() as setup:
            await setup.execute(text(CREATE_ORDERS))
        async with app:
            if kind == "connection":
                async with engine.connect() as connection:
                    await connection.begin()
                    await connection.execute(text("INSERT INTO orders (id, item) VALUES (7, 'x')"))
                    job_id = await confirm_order.defer(order_id=7, using=connection)
                    if db_url.startswith("postgresql"):
                        # SQLAlchemy's own codecs are back: JSON decodes to objects again.
                        decoded = await connection.execute(text("""SELECT CAST('{"a": 1}' AS JSON)"""))
                        assert decoded.scalar_one() == {"a": 1}
                    await (connection.commit() if commit else connection.rollback())
            else:
                async with AsyncSession(engine) as session:
                    await session.execute(text("INSERT INTO orders (id, item) VALUES (7, 'x')"))
                    job_id = await confirm_order.defer(order_id=7, using=session)
                    await (session.commit() if commit else session.rollback())
            stats = await app.worker(idle_wait_s=0.1).run_until_idle()
            assert (await orders(db_url) == [7]) is commit
            assert stats.completed == (1 if commit else 0)
            outcome = await app.result(job_id)
            assert (outcome is not None and outcome.ok) is commit
    finally:
        await engine.dispose()


async def test_using_refuses_what_cannot_carry_the_task_and_writes_nothing(db_url: str) -> None:
    app, confirm_order = make_app(db_url)
    async with app:
        with pytest.raises(ConfigValidationError) as wrong_type:
            await confirm_order.defer(order_id=1, using=object())
        assert wrong_type.value.fields == ("using",)
        async with driver_transaction(db_url) as (connection, _, _, do_rollback):
            await do_rollback()  # no transaction open any more
            with pytest.raises(ConfigValidationError) as closed:
                await confirm_order.defer(order_id=1, using=connection)
            assert closed.value.problems == ("open_transaction_required",)
        # The refusal names the driver this database needs.
        needed = "aiosqlite" if db_url.startswith("sqlite") else "asyncpg"
        assert wrong_type.value.problems == (f"{needed}_connection_required",)
        assert await app.source.list_tasks() == []


@pytest.mark.parametrize("kind", ["connection", "session"])
async def test_a_deferral_first_in_a_sqlalchemy_transaction_joins_it(db_url: str, kind: str) -> None:
    """SQLAlchemy begins the driver's transaction at its first statement: a deferral that
    comes first still joins the caller's transaction (and a rollback removes it)."""
    app, confirm_order = make_app(db_url)
    engine = create_async_engine(_sqlalchemy_url(db_url))
    try:
        async with app:
            if kind == "connection":
                async with engine.connect() as connection:
                    await connection.begin()
                    await confirm_order.defer(order_id=1, using=connection)
                    await connection.rollback()
                    await connection.begin()
                    kept = await confirm_order.defer(order_id=2, using=connection)
                    await connection.commit()
            else:
                async with AsyncSession(engine) as session:
                    await confirm_order.defer(order_id=1, using=session)
                    await session.rollback()
                    kept = await confirm_order.defer(order_id=2, using=session)
                    await session.commit()
            assert [info.job_id for info in await app.source.list_tasks()] == [kept]
    finally:
        await engine.dispose()
