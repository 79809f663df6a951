"""A program that uses tenure exits when it ends, on every database: whether it crashes
before ``close()`` or simply returns without calling it, the process ends (on SQLite the
connection's thread never keeps it alive) and what it wrote before is in the database."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from tenure.adapters import TaskApp

HANG_GUARD_SECONDS = 120
"""A program still running by then has hung (it exits in about a second otherwise)."""

PROGRAM = '''
import asyncio
import os
import sys

from tenure.adapters import TaskApp, TaskContext

app = TaskApp(os.environ["EXIT_DB"])


@app.task(queue="emails", name="send_welcome")
async def send_welcome(ctx: TaskContext, user_id: int) -> None: ...


async def main() -> None:
    await send_welcome.defer(user_id=1)
    await send_welcome.defer_many([{"user_id": n} for n in range(2, 5)])
    if sys.argv[1] == "raise":
        raise RuntimeError("the program crashes before close()")


asyncio.run(main())
'''


@pytest.mark.parametrize(("ending", "status"), [("raise", 1), ("return", 0)])
async def test_a_program_that_never_reaches_close_exits_and_keeps_what_it_wrote(
    db_url: str, tmp_path: pathlib.Path, ending: str, status: int
) -> None:
    (tmp_path / "program.py").write_text(PROGRAM, encoding="utf-8")
    try:
        ended = subprocess.run([sys.executable, "-P", "program.py", ending], cwd=tmp_path, capture_output=True,
                               text=True, timeout=HANG_GUARD_SECONDS, check=False,
                               env={**os.environ, "EXIT_DB": db_url})
    except subprocess.TimeoutExpired:
        pytest.fail(f"the program ending with {ending!r} did not exit within {HANG_GUARD_SECONDS} s")
    assert ended.returncode == status, ended.stdout + ended.stderr
    if ending == "raise":
        assert "RuntimeError: the program crashes before close()" in ended.stderr
    async with TaskApp(db_url) as app:
        assert len(await app.source.list_tasks(limit=100)) == 4
