"""``tenure worker --app`` serves an App's tasks and workflows together, and a worker killed
(SIGKILL) between a step's effect and its journal write leaves a Run that the next worker
under the same node replays: the step runs again (a step's body is at least once), is
recorded once, and the Run ends DONE with one hop retried; a worker killed between a
child Run's admission and its record on the parent's job leaves a parent whose retried hop
adopts that same child and ends DONE with its result; on every database."""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal
import subprocess
import sys
from typing import Any

import pytest
from polling import until

from tenure.adapters import App, WorkflowContext
from tenure.adapters.runs.replay import JOURNAL_PREFIX
from tenure.model import RunStatus

HANG_GUARD_S = 120
"""A command still running by then has hung."""

APP = '''
import os
import pathlib
import signal

from tenure.adapters import App

app = App(os.environ["APP_DB"])
EFFECTS = pathlib.Path(os.environ["EFFECTS_FILE"])


@app.task(queue="emails", name="send_welcome")
async def send_welcome(ctx, user_id: int) -> dict:
    return {"sent_to": user_id}


def charge(order: str) -> str:
    with EFFECTS.open("a", encoding="utf-8") as effects:
        effects.write(order + "\\n")
    if len(EFFECTS.read_text(encoding="utf-8").splitlines()) == 1 and os.environ.get("KILL_AFTER_EFFECT"):
        os.kill(os.getpid(), signal.SIGKILL)  # the effect happened; its journal write never will
    return "charged:" + order


@app.workflow(name="checkout", on_lost="retry", max_hop_retries=2)
async def checkout(ctx, order: str) -> dict:
    receipt = await ctx.step(charge, order)
    return {"receipt": receipt}
'''

TENURE = [sys.executable, "-P", "-m", "tenure.apps.cli"]


def same_app(db_url: str) -> App:
    """The worker's App as this test process sees it (the same name and version)."""
    app = App(db_url)

    @app.workflow(name="checkout", on_lost="retry", max_hop_retries=2)
    async def checkout(ctx: WorkflowContext, order: str) -> dict[str, Any]:
        raise AssertionError("only the worker process runs it")

    return app


def start_worker(tmp_path: pathlib.Path, db_url: str, *, kill_after_effect: bool, log_name: str,
                 module: str = "appmod") -> subprocess.Popen[str]:
    environment = {name: value for name, value in os.environ.items() if name != "TENURE_DB"}
    environment.update(APP_DB=db_url, EFFECTS_FILE=str(tmp_path / "effects.txt"))
    if kill_after_effect:
        environment["KILL_AFTER_EFFECT"] = "1"
    with open(tmp_path / log_name, "w", encoding="utf-8") as log:
        return subprocess.Popen([*TENURE, "worker", "--app", f"{module}:app", "--worker-id", "node-k", "--idle-wait",
                                 "0.2"], cwd=tmp_path, env=environment, stdout=log, stderr=subprocess.STDOUT,
                                text=True)


async def stop(worker: subprocess.Popen[str]) -> None:
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
    try:
        await asyncio.to_thread(worker.wait, HANG_GUARD_S)
    except subprocess.TimeoutExpired:
        worker.kill()
        pytest.fail(f"the worker did not exit within {HANG_GUARD_S} s of SIGTERM")


async def test_a_worker_killed_after_a_steps_effect_leaves_a_run_the_next_worker_replays_to_done(
        db_url: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "appmod.py").write_text(APP, encoding="utf-8")
    app = same_app(db_url)
    first = start_worker(tmp_path, db_url, kill_after_effect=True, log_name="first.log")
    try:
        handle = await app.workflows["checkout"].start("o-9", key="checkout-o-9")
        await asyncio.to_thread(first.wait, HANG_GUARD_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text(encoding="utf-8")
    run = await handle.status()
    assert run is not None and run.status is RunStatus.RUNNING  # held by a hop that died
    assert await app.ledger.steps.recorded(handle.run_id) == {}  # the effect happened, its record did not

    second = start_worker(tmp_path, db_url, kill_after_effect=True, log_name="second.log")
    try:
        assert await handle.result(wait_s=HANG_GUARD_S) == {"receipt": "charged:o-9"}
    finally:
        await stop(second)
    assert second.returncode == 0, (tmp_path / "second.log").read_text(encoding="utf-8")
    assert (tmp_path / "effects.txt").read_text(encoding="utf-8").splitlines() == ["o-9", "o-9"]
    journal = await app.ledger.steps.recorded(handle.run_id)
    assert journal == {f"{JOURNAL_PREFIX}0": {"call": "step:charge", "answer": "charged:o-9"}}
    run = await handle.status()
    assert run is not None and run.hop_retries == 1
    await app.close()


async def test_the_worker_command_serves_an_apps_tasks_and_workflows_together(
        db_url: str, tmp_path: pathlib.Path) -> None:
    (tmp_path / "appmod.py").write_text(APP, encoding="utf-8")
    app = same_app(db_url)

    @app.task(queue="emails", name="send_welcome")
    async def send_welcome(ctx: Any, user_id: int) -> dict[str, int]:
        raise AssertionError("only the worker process runs it")

    worker = start_worker(tmp_path, db_url, kill_after_effect=False, log_name="worker.log")
    try:
        handle = await app.workflows["checkout"].start("o-1")
        job_id = await send_welcome.defer(user_id=7)
        assert await handle.result(wait_s=HANG_GUARD_S) == {"receipt": "charged:o-1"}
        await until(lambda: _completed(app, job_id), HANG_GUARD_S, what="the task completed")
    finally:
        await stop(worker)
    output = (tmp_path / "worker.log").read_text(encoding="utf-8")
    assert worker.returncode == 0, output
    assert "workflows checkout on Run queues workflows: node node-k" in output
    await app.close()


STORY_APP = '''
import os
import pathlib
import signal

from tenure.adapters import App

app = App(os.environ["APP_DB"])
EFFECTS = pathlib.Path(os.environ["EFFECTS_FILE"])


@app.workflow(name="leaf", on_lost="retry", max_hop_retries=2)
async def leaf(ctx, n: int) -> dict:
    with EFFECTS.open("a", encoding="utf-8") as effects:
        effects.write(f"leaf {n}\\n")
    return {"leaf": n * 10}


@app.workflow(name="story", on_lost="retry", max_hop_retries=2)
async def story(ctx, n: int) -> dict:
    child = await ctx.start_child(leaf, n)
    return {"child": child.run_id, "answer": await child.result()}


admit_child = app.start_child_run


async def admitted_then_killed(*args, **kwargs):
    if os.environ.get("KILL_AFTER_EFFECT"):
        # Killed once the child is admitted, before its hop is published (so no hop of it
        # is held by this process): its parent's job never records it.
        async def killed(*published, **how):
            os.kill(os.getpid(), signal.SIGKILL)

        app.ledger.publish = killed
    return await admit_child(*args, **kwargs)


app.start_child_run = admitted_then_killed
'''


async def test_a_worker_killed_between_a_childs_admission_and_its_record_leaves_a_parent_that_adopts_that_child(
        db_url: str, tmp_path: pathlib.Path) -> None:
    """The retried hop of the parent carries its delegated job (specs/recovery.md REC-13):
    it asks for the same child at the same position, so it adopts the child the lost hop
    admitted and ends DONE with that child's result. Before, recovery cancelled the child
    first (a cancelled child, or a finished one recorded cancelled on its job), and the
    retried parent failed ``ChildFailed: ... ended cancelled`` (found by the Run chaos test)."""
    (tmp_path / "storymod.py").write_text(STORY_APP, encoding="utf-8")
    app = App(db_url)

    @app.workflow(name="leaf", on_lost="retry", max_hop_retries=2)
    async def leaf(ctx: WorkflowContext, n: int) -> dict[str, Any]:
        raise AssertionError("only the worker process runs it")

    @app.workflow(name="story", on_lost="retry", max_hop_retries=2)
    async def story(ctx: WorkflowContext, n: int) -> dict[str, Any]:
        raise AssertionError("only the worker process runs it")

    first = start_worker(tmp_path, db_url, kill_after_effect=True, log_name="first.log", module="storymod")
    try:
        handle = await story.start(4)
        await asyncio.to_thread(first.wait, HANG_GUARD_S)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == -signal.SIGKILL, (tmp_path / "first.log").read_text(encoding="utf-8")
    (job,) = await app.ledger.jobs.list(handle.run_id)  # open, and names no child yet
    assert job.runtime_job_id is None
    child_id = App.key_run_id(f"child:{handle.run_id}@0")
    assert await app.ledger.get(child_id) is not None  # admitted before the kill

    second = start_worker(tmp_path, db_url, kill_after_effect=False, log_name="second.log", module="storymod")
    try:
        assert await handle.result(wait_s=HANG_GUARD_S) == {"child": child_id, "answer": {"leaf": 40}}
    finally:
        await stop(second)
    assert second.returncode == 0, (tmp_path / "second.log").read_text(encoding="utf-8")
    run = await handle.status()
    assert run is not None and run.hop_retries == 1  # the parent's hop ran again, once
    assert len((await app.ledger.list_runs()).items) == 2  # the parent and its one child
    adopted = await app.ledger.jobs.get(job.job_id)
    assert adopted is not None and adopted.status.value == "succeeded" and adopted.runtime_job_id == child_id
    await app.close()


async def _completed(app: App, job_id: str) -> bool:
    outcome = await app.result(job_id)
    return outcome is not None and outcome.ok
