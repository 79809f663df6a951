"""A task's default name does not depend on how its module was loaded: a task defined in a
script run as ``python jobs.py`` (where its module is ``__main__``) is named as the
worker that imports ``jobs`` names it, so a task deferred by the script is run by
``tenure worker --app jobs:app``; where no file names the module (``python -c``, an
interactive session), ``name=`` is required."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HANG_GUARD_SECONDS = 120

JOBS = '''
import asyncio
import os
import sys

from tenure.adapters import TaskApp, TaskContext

app = TaskApp(os.environ.get("NAMES_DB", "sqlite:///unused.db"))


@app.task(queue="emails")
async def send_welcome(ctx: TaskContext, user_id: int) -> dict:
    return {"sent_to": user_id}


async def defer() -> None:
    print(await send_welcome.defer(user_id=42))
    await app.close()


if __name__ == "__main__":
    print(send_welcome.name)
    if sys.argv[1:] == ["defer"]:
        asyncio.run(defer())
'''

WORK = '''
import asyncio
import sys

from {module} import app


async def work() -> None:
    stats = await app.worker(idle_wait_s=0.1).run_until_idle()
    outcome = await app.result(sys.argv[1])
    print(stats.completed, outcome.status.value, outcome.result)
    await app.close()

asyncio.run(work())
'''


def python(folder: pathlib.Path, *arguments: str, db_url: str | None = None) -> subprocess.CompletedProcess[str]:
    environment = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    if db_url is not None:
        environment["NAMES_DB"] = db_url
    done = subprocess.run([sys.executable, *arguments], cwd=folder, capture_output=True, text=True, check=False,
                          timeout=HANG_GUARD_SECONDS, env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def imported_name(folder: pathlib.Path, module: str) -> str:
    return python(folder, "-c", f"import {module}; print({module}.send_welcome.name)").stdout.strip()


def test_a_script_names_its_task_as_the_module_the_worker_imports(tmp_path: pathlib.Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS, encoding="utf-8")
    assert python(tmp_path, "jobs.py").stdout.strip() == "jobs.send_welcome" == imported_name(tmp_path, "jobs")
    assert python(tmp_path, "-m", "jobs").stdout.strip() == "jobs.send_welcome"
    # From another folder, and inside a package (found by its __init__.py).
    package = tmp_path / "shop"
    package.mkdir()
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "tasks.py").write_text(JOBS, encoding="utf-8")
    assert python(tmp_path.parent, str(package / "tasks.py")).stdout.strip() == "shop.tasks.send_welcome"
    assert python(tmp_path, "-m", "shop.tasks").stdout.strip() == "shop.tasks.send_welcome"
    assert imported_name(tmp_path, "shop.tasks") == "shop.tasks.send_welcome"


def test_a_task_without_a_module_file_needs_a_name(tmp_path: pathlib.Path) -> None:
    code = ("from tenure.adapters import TaskApp\n"
            "from tenure.model import ConfigValidationError\n"
            "app = TaskApp('sqlite:///unused.db')\n"
            "async def send(ctx): ...\n"
            "try:\n"
            "    app.task(send)\n"
            "except ConfigValidationError as error:\n"
            "    print(error.fields, error.problems)\n"
            "print(app.task(name='send')(send).name)\n")
    assert python(tmp_path, "-c", code).stdout.splitlines() == ["('name',) ('name_required_outside_a_module_file',)",
                                                                "send"]


async def test_a_task_a_script_deferred_is_run_by_a_worker_that_imports_the_script(
    db_url: str, tmp_path: pathlib.Path
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS, encoding="utf-8")
    (tmp_path / "work.py").write_text(WORK.format(module="jobs"), encoding="utf-8")
    name, job_id = python(tmp_path, "jobs.py", "defer", db_url=db_url).stdout.split()
    assert name == "jobs.send_welcome"
    assert python(tmp_path, "work.py", job_id, db_url=db_url).stdout.strip() == "1 completed {'sent_to': 42}"

