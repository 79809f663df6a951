"""``--db`` names the database an ``--app`` command uses, on every database: ``tenure jobs
defer --app m:app --db B`` writes the task into B, and ``tenure worker --app m:app --db
B`` serves B and defers its periodic ticks into B, never into the app's own database;
both commands exit (SIGTERM for the worker)."""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

import adapter_support
from adapter_support import raw
from polling import until
from tenure.adapters import upgrade

HANG_GUARD_SECONDS = 120
"""A command still running by then has hung."""

APP = '''
import os

from tenure.adapters import TaskApp

app = TaskApp(os.environ["APP_OWN_DB"])


@app.task(queue="emails", name="send_welcome")
async def send_welcome(ctx, user_id: int) -> dict:
    return {"sent_to": user_id}


@app.periodic(cron="* * * * *", name="minutely", queue="emails")
async def minutely(ctx, tick: str) -> str:
    return tick
'''

TENURE = [sys.executable, "-P", "-m", "tenure.apps.cli"]


def tasks_in(db_url: str) -> list[tuple[str, str, str]]:
    return [tuple(row) for row in raw(db_url, "SELECT id, task_name, status FROM tenure_tasks ORDER BY id")]


async def test_an_app_command_uses_the_database_its_db_flag_names(
    db_url: str, database: str, tmp_path: pathlib.Path, request: pytest.FixtureRequest
) -> None:
    (tmp_path / "other").mkdir()
    named = adapter_support.new_database(database, tmp_path / "other", request)
    await upgrade(named)
    (tmp_path / "appmod.py").write_text(APP, encoding="utf-8")
    environment = {name: value for name, value in os.environ.items() if name != "TENURE_DB"}
    environment["APP_OWN_DB"] = db_url  # the app's own database: never to be written

    def defer() -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run([*TENURE, "jobs", "defer", "--app", "appmod:app", "send_welcome", "--args",
                                   json.dumps({"user_id": 7}), "--db", named], cwd=tmp_path, env=environment,
                                  capture_output=True, text=True, timeout=HANG_GUARD_SECONDS, check=False)
        except subprocess.TimeoutExpired:
            pytest.fail(f"tenure jobs defer did not exit within {HANG_GUARD_SECONDS} s")

    deferred = await asyncio.to_thread(defer)
    assert deferred.returncode == 0, deferred.stdout + deferred.stderr
    job_id = deferred.stdout.splitlines()[1].split()[0]
    assert tasks_in(named) == [(job_id, "send_welcome", "pending")]
    assert tasks_in(db_url) == []

    with open(tmp_path / "worker.log", "w", encoding="utf-8") as log:
        worker = subprocess.Popen([*TENURE, "worker", "--app", "appmod:app", "--db", named, "--idle-wait", "0.2"],
                                  cwd=tmp_path, env=environment, stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
        def both_done() -> bool:
            rows = tasks_in(named)
            return {name for _, name, status in rows if status == "completed"} == {"send_welcome", "minutely"}

        await until(lambda: asyncio.to_thread(both_done), HANG_GUARD_SECONDS,
                    what="the worker ran the deferred task and a periodic tick in the named database",
                    interval_s=0.2)
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(worker.wait, HANG_GUARD_SECONDS)
        except subprocess.TimeoutExpired:
            worker.kill()
            pytest.fail(f"the worker did not exit within {HANG_GUARD_SECONDS} s of SIGTERM")
    output = (tmp_path / "worker.log").read_text(encoding="utf-8")
    assert worker.returncode == 0, output
    assert tasks_in(db_url) == []  # no task, no tick in the app's own database
