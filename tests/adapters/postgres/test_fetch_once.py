"""``connections.fetch_once``, the boundary of every one-statement call (issue 51: the
call's deadline is the driver's own timeout): a deadline that passed before the statement
was sent sends nothing and says ``timeout``; the time left is what the driver is given; a
driver timeout or a lost connection once it was sent leaves the outcome unknown
(``commit_unacknowledged``); an error the server answered keeps its own reason. No
database: a stand-in connection records what it was asked (the frozen-server tests in
test_failures.py hold the same outcomes against a real server)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from tenure.adapters.postgres.connections import fetch_once
from tenure.model import TenureError


class _Connection:
    def __init__(self, outcome: Any) -> None:
        self.outcome = outcome
        self.sent: list[tuple[str, tuple[Any, ...], float]] = []

    async def fetch(self, sql: str, *arguments: Any, timeout: float) -> Any:
        self.sent.append((sql, arguments, timeout))
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome


async def _reason(connection: _Connection, deadline_in_s: float) -> str:
    with pytest.raises(TenureError) as caught:
        await fetch_once(connection, "SELECT $1", [1], asyncio.get_running_loop().time() + deadline_in_s)
    return caught.value.reason


async def test_a_deadline_already_passed_sends_nothing_and_says_timeout() -> None:
    connection = _Connection([("row",)])
    assert await _reason(connection, -0.001) == "timeout"
    assert connection.sent == []


async def test_the_driver_is_given_the_time_left_and_the_rows_come_back() -> None:
    connection = _Connection([("row",)])
    assert await fetch_once(connection, "SELECT $1", [1], asyncio.get_running_loop().time() + 5) == [("row",)]
    ((sql, arguments, timeout),) = connection.sent
    assert (sql, arguments) == ("SELECT $1", (1,)) and 0 < timeout <= 5


@pytest.mark.parametrize("failure", [TimeoutError(), ConnectionResetError(), OSError("reset")])
async def test_a_failure_once_sent_leaves_the_outcome_unknown(failure: Exception) -> None:
    assert await _reason(_Connection(failure), 5) == "commit_unacknowledged"


@pytest.mark.parametrize(("answer", "reason"), [(asyncpg.DeadlockDetectedError("no"), "deadlock"),
                                                (asyncpg.UniqueViolationError("no"), "constraint_violated"),
                                                (asyncpg.DivisionByZeroError("no"), "read_back_mismatch")])
async def test_an_error_the_server_answered_keeps_its_own_reason(answer: Exception, reason: str) -> None:
    assert await _reason(_Connection(answer), 5) == reason
