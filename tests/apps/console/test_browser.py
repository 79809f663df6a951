"""The console in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver`` packages, driven by Selenium through ``/usr/bin/chromedriver``; nothing
is downloaded) against a real ``tenure console`` process, on SQLite and PostgreSQL.

- an operator grants a consent in the inbox and a real Run worker (``tenure runs worker``)
  finishes the Run; another Run is cancelled from its page;
- a failed job is retried from its page and a real task worker (``tenure worker --app``)
  completes it; its error, full of markup, shows as text and runs no script;
- a console with a token sends the browser to ``/login``, refuses a wrong token, accepts
  the right one; a form whose CSRF field was tampered with is refused (403) and changes
  nothing;
- every page is saved as a screenshot: in ``$TENURE_SCREENSHOTS`` when set, else in
  pytest's temporary folder (the paths are printed: ``pytest -s`` or ``-rP`` shows them).
  ``TENURE_DOCS_IMAGES=docs/images`` also writes the overview and the inbox (SQLite) as
  ``console-overview.png`` and ``console-consents.png``, the images the docs show.

Every wait is a hang guard (poll until a condition, fail with what was awaited after a
generous deadline), never a sleep followed by an assertion. Without Chromium or its
driver the tests fail naming the packages to install: a skip would hide them in CI.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from adapter_support import _run_async
from console_seed import HOSTILE_ERROR, park_on_consent, seed

from tenure.adapters import InMemoryBroker, RunLedger
from tenure.adapters.queue.sources import TaskSource
from tenure.adapters.runs.recovery import RecoveryReport
from tenure.model import ConsentStatus, RunIntent, RunStatus, TaskJob, WorkflowPin

pytestmark = pytest.mark.browser  # needs Debian's chromium and chromium-driver (see pyproject's markers)

CHROMIUM = pathlib.Path("/usr/bin/chromium")
CHROMEDRIVER = pathlib.Path("/usr/bin/chromedriver")
INSTALL = "apt-get install -y --no-install-recommends chromium chromium-driver"
WINDOW = (1280, 900)
DEADLINE_SECONDS = 120.0
"""How long any wait may last before it fails: generous, for a loaded 2-core machine."""
TOKEN = "browser-token-0123456789abcdef"

T = TypeVar("T")

FLOWS = '''
from tenure.adapters import Workflows

registry = Workflows()


@registry.workflow("refund", "1")
async def refund(ctx):
    if not ctx.resumed:
        await ctx.request_consent(tool_name="payments.refund", tool_call_id="call-1",
                                  payload={"order": "A-1001", "amount_eur": 42}, state={"n": 1})
    if ctx.consent.verdict is not True:
        raise PermissionError()
'''

TASKS = '''
import os

from tenure.adapters import TaskApp

app = TaskApp(os.environ["TENURE_DB"])


@app.task(queue="emails", name="send")
async def send(ctx, secret, n):
    return {"sent": n}
'''


# --- the browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (each test starts from no cookies)."""
    missing = [str(path) for path in (CHROMIUM, CHROMEDRIVER) if not path.is_file()]
    if missing:
        pytest.fail(f"the browser tests need Debian's Chromium and its driver ({', '.join(missing)} missing): "
                    f"as root, {INSTALL}", pytrace=False)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="tenure-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                 "--no-first-run", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--hide-scrollbars", "--force-device-scale-factor=1",
                 f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    # An explicit driver path: Selenium Manager is never asked (it would download one).
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(DEADLINE_SECONDS)
    # The window's size includes the headless browser's own frame: grow the window by it,
    # so that the page's viewport, and every screenshot, is exactly WINDOW.
    frame = driver.execute_script("return [window.outerWidth - window.innerWidth, "
                                  "window.outerHeight - window.innerHeight]")
    driver.set_window_size(WINDOW[0] + frame[0], WINDOW[1] + frame[1])
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    chosen = os.environ.get("TENURE_SCREENSHOTS")
    if chosen:
        folder = pathlib.Path(chosen)
        folder.mkdir(parents=True, exist_ok=True)
        return folder
    return tmp_path_factory.mktemp("console-screenshots")


def shoot(driver: Any, folder: pathlib.Path, name: str) -> pathlib.Path:
    path = folder / f"{name}.png"
    assert driver.save_screenshot(str(path)), path
    print(f"screenshot: {path}")
    return path


def where(driver: Any) -> str:
    """What the browser shows, for a wait's failure: its address, its page's text, a screenshot."""
    try:
        shot = pathlib.Path(tempfile.mkdtemp(prefix="tenure-browser-failure-")) / "page.png"
        driver.save_screenshot(str(shot))
        text = driver.execute_script("return document.body ? document.body.innerText : ''")[:1500]
        return f"; the browser is at {driver.current_url} ({shot}), showing:\n{text}"
    except Exception as error:  # the browser itself is stuck: say so
        return f"; the browser does not answer ({error!r})"


def wait_until(condition: Callable[[], T | None], what: str, *, seconds: float = DEADLINE_SECONDS,
               browser: Any = None) -> T:
    """Poll ``condition`` until it answers something truthy; fail naming ``what`` after
    ``seconds``. An exception (a page between two loads) means "not yet"; ``pytest.fail``
    (a process that exited: see :func:`process`) ends the wait at once."""
    deadline = time.monotonic() + seconds
    last: Any = None
    while True:
        try:
            value = condition()
        except Exception as error:
            value, last = None, error
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"after {seconds:.0f} s, still waiting for {what} (last error: {last!r})"
                                 + (where(browser) if browser is not None else ""))
        time.sleep(0.25)


def by_testid(driver: Any, testid: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.CSS_SELECTOR, f'[data-testid="{testid}"]')


def page_of(driver: Any) -> str:
    from selenium.webdriver.common.by import By

    return str(driver.find_element(By.TAG_NAME, "main").get_attribute("data-page"))


def open_page(driver: Any, url: str, page: str) -> None:
    driver.get(url)
    assert page_of(driver) == page, (url, driver.current_url, page_of(driver))


def status_after_reload(driver: Any, url: str, testid: str) -> str:
    driver.get(url)
    return str(by_testid(driver, testid).text)


def after_form(driver: Any, page: str, *testids: str) -> tuple[str, ...]:
    """Once a form's redirect has landed on ``page``: its outcome word and the texts of ``testids``."""
    def landed() -> tuple[str, ...] | None:
        if "outcome=" not in driver.current_url or page_of(driver) != page:
            return None
        outcome = str(by_testid(driver, "flash").get_attribute("data-outcome"))
        return (outcome, *(str(by_testid(driver, testid).text) for testid in testids))

    return wait_until(landed, f"the {page} page after a form", browser=driver)


def page_after_reload(driver: Any, url: str) -> str:
    driver.get(url)
    return page_of(driver)


def no_alert(driver: Any) -> bool:
    from selenium.common.exceptions import NoAlertPresentException

    try:
        driver.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


# --- real processes -----------------------------------------------------------------------


def cli(*arguments: str) -> list[str]:
    return [sys.executable, "-P", "-m", "tenure.apps.cli", *arguments]


@contextlib.contextmanager
def process(name: str, arguments: list[str], folder: pathlib.Path,
            env: dict[str, str]) -> Iterator[Callable[[], str]]:
    """A process whose output goes to files (no pipe to fill); SIGTERM at the end, exit 0
    required. Yields a function that reads its output so far, and fails at once (with its
    errors) once the process has exited."""
    out, err = folder / f"{name}.out", folder / f"{name}.err"
    with out.open("w") as stdout, err.open("w") as stderr:
        started = subprocess.Popen(arguments, cwd=folder, stdout=stdout, stderr=stderr, text=True,
                                   env={**os.environ, **env})

    def output() -> str:
        if started.poll() is not None:
            pytest.fail(f"{name} exited {started.returncode}: {err.read_text()[-3000:]}", pytrace=False)
        return out.read_text()

    try:
        yield output
    finally:
        if started.poll() is None:
            started.send_signal(signal.SIGTERM)
        try:
            started.wait(timeout=DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            started.kill()
            started.wait()
    assert started.returncode == 0, f"{name} exited {started.returncode}: {err.read_text()[-3000:]}"


@contextlib.contextmanager
def console_process(db_url: str, folder: pathlib.Path, *, token: str | None = None) -> Iterator[str]:
    """``tenure console --port 0``: the address it serves, read from its first line."""
    env = {"TENURE_DB": db_url, **({"TENURE_CONSOLE_TOKEN": token} if token else {})}
    with process("console", cli("console", "--port", "0"), folder, env) as output:

        def first_line() -> str | None:
            line, newline, _ = output().partition("\n")
            return line if newline else None

        first = wait_until(first_line, "the console's first line")
        found = re.match(r"console: serving (http://127\.0\.0\.1:[0-9]+/) ", first)
        assert found is not None, first
        yield found.group(1)


def admit(folder: pathlib.Path, db_url: str, key: str) -> str:
    admitted = subprocess.run(
        cli("runs", "admit", "--db", db_url, "--broker", "queue", "--queue", "browser", "--workflows",
            "flows:registry", "--workflow", "refund", "--revision", "1", "--key", key),
        cwd=folder, capture_output=True, text=True, timeout=DEADLINE_SECONDS, check=False)
    assert admitted.returncode == 0, admitted.stdout + admitted.stderr
    return admitted.stdout.splitlines()[1].split()[0]


def fresh_session(driver: Any, base: str) -> None:
    """Start from no cookies: every console of the module listens on 127.0.0.1 (cookies ignore ports)."""
    driver.get(base + "static/console.css")
    driver.delete_all_cookies()


# --- readable data for the screenshots ----------------------------------------------------------


async def decided_and_settled(ledger: RunLedger, tool_name: str, verdict: ConsentStatus, by: str,
                              status: RunStatus) -> None:
    """A Run parked on a consent, decided, resumed and settled as its workflow would."""
    run_id, consent_id = await park_on_consent(ledger, tool_name=tool_name)
    assert await ledger.consents.decide(consent_id, verdict, decided_by=by)
    hop = await ledger.resume(run_id, owner_id=consent_id)
    assert hop is not None and await ledger.publish(run_id, hop, InMemoryBroker())
    assert await ledger.claim(run_id, hop, node="worker-a") is not None
    error = "PermissionError: the consent was denied" if status is RunStatus.FAILED else None
    assert await ledger.settle(run_id, hop, status, error=error, result={"updated": True} if error is None else None)


async def seed_readable(db_url: str) -> dict[str, str]:
    """What an operator might see on a quiet afternoon (no hostile text: these are the docs' images)."""
    async with TaskSource(db_url) as tasks:
        await tasks.submit_many(
            [TaskJob(queue_name="emails", task_name="send_welcome", args={"user_id": n}) for n in range(7)]
            + [TaskJob(queue_name="reports", task_name="render_invoice", args={"invoice": n}) for n in range(4)])
        for _ in range(3):
            done = await tasks.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex, queues=["emails"])
            assert done is not None and done.claim_fence is not None
            assert await tasks.complete_owned(done.claim_fence, {"sent": True})
        failing = await tasks.claim_next_owned("worker-a", claim_token=uuid.uuid4().hex, queues=["emails"])
        assert failing is not None and failing.claim_fence is not None
        assert await tasks.fail_owned(failing.claim_fence, "SMTPRecipientsRefused: 550 5.1.1 mailbox unavailable",
                                      retry=False)
        running = await tasks.claim_next_owned("worker-b", claim_token=uuid.uuid4().hex, queues=["reports"])
        assert running is not None
    async with RunLedger(db_url) as ledger:
        waiting, pending = await park_on_consent(ledger, tool_name="payments.refund", with_job=True)
        await park_on_consent(ledger, tool_name="email.send_bulk")
        await decided_and_settled(ledger, "crm.update_contact", ConsentStatus.GRANTED, "dave", RunStatus.DONE)
        await decided_and_settled(ledger, "files.delete", ConsentStatus.DENIED, "carol", RunStatus.FAILED)
        intent = RunIntent(None, "support-desk", "bob", frozenset({"mail:send"}), {"ticket": 4711})
        await ledger.admit(intent, workflow=WorkflowPin("triage", "3", "sha256:" + "b" * 64), queue="runs",
                           priority=20)
        await ledger.recovery_reports.record("worker-a", "startup",
                                             RecoveryReport(False, {"published": 2, "resumed": 1}, ()), ["runs"])
    return {"failed_task": failing.job_id, "waiting_run": waiting, "pending_consent": pending}


# --- the tests ---------------------------------------------------------------------------------


def test_every_page_renders_in_chromium_and_is_saved_as_a_screenshot(
    browser: Any, console_url: str, database: str, screenshots: pathlib.Path, tmp_path: pathlib.Path,
) -> None:
    ids = _run_async(seed_readable(console_url))
    with console_process(console_url, tmp_path) as base:
        fresh_session(browser, base)
        pages = [("overview", "", "overview"), ("jobs", "jobs?queue=tasks", "jobs"),
                 ("job", f"jobs/tasks/{ids['failed_task']}", "job"), ("runs", "runs", "runs"),
                 ("run", f"runs/{ids['waiting_run']}", "run"), ("consents", "consents", "consents"),
                 ("consent", f"consents/{ids['pending_consent']}", "consent"), ("not-found", "runs/nothing", "error")]
        saved = {}
        for name, path, page in pages:
            open_page(browser, base + path, page)
            saved[name] = shoot(browser, screenshots, f"{database}-{name}")
        assert by_testid(browser, "error-page").get_attribute("data-status") == "404"
        # What the overview and the inbox show, as the browser lays it out.
        open_page(browser, base, "overview")
        assert by_testid(browser, "pending-consents-count").text == "2"
        open_page(browser, base + "consents", "consents")
        tools = [row.text for row in browser.find_elements("css selector", '[data-testid="consent-tool"]')]
        assert sorted(tools) == ["email.send_bulk", "payments.refund"]
        decided = [row.text for row in browser.find_elements("css selector", '[data-testid="decided-by"]')]
        assert sorted(decided) == ["carol", "dave"]
    docs = os.environ.get("TENURE_DOCS_IMAGES")
    if docs and database == "sqlite":
        shutil.copyfile(saved["overview"], pathlib.Path(docs) / "console-overview.png")
        shutil.copyfile(saved["consents"], pathlib.Path(docs) / "console-consents.png")


def test_a_consent_granted_in_the_inbox_lets_a_run_worker_finish_the_run_and_another_run_is_cancelled(
    browser: Any, console_url: str, tmp_path: pathlib.Path,
) -> None:
    (tmp_path / "flows.py").write_text(FLOWS, encoding="utf-8")
    granted, cancelled = admit(tmp_path, console_url, "refund-1"), admit(tmp_path, console_url, "refund-2")
    worker = cli("runs", "worker", "--db", console_url, "--broker", "queue", "--queue", "browser", "--workflows",
                 "flows:registry", "--node", "browser-node", "--relay-seconds", "0.5", "--node-lease-seconds", "10")
    with console_process(console_url, tmp_path) as base, process("runs-worker", worker, tmp_path, {}) as alive:
        fresh_session(browser, base)

        def both_pending() -> list[Any] | None:
            alive()
            open_page(browser, base + "consents", "consents")
            rows = browser.find_elements("css selector", '[data-testid="consent-row"]')
            return rows if len(rows) == 2 else None

        rows = wait_until(both_pending, "both Runs parked on a consent, in the inbox", browser=browser)
        row = next(row for row in rows if row.get_attribute("data-run-id") == granted)
        row.find_element("css selector", '[data-testid="consent-by"]').send_keys("ada")
        row.find_element("css selector", '[data-testid="consent-grant"]').click()
        outcome, decided_by = after_form(browser, "consent", "consent-decided-by")
        assert outcome in ("decided_resumed", "decided") and decided_by == "ada"
        run_page = base + f"runs/{granted}"
        wait_until(lambda: alive() is not None and status_after_reload(browser, run_page, "run-status") == "done",
                   f"Run {granted} done on its page", browser=browser)

        open_page(browser, base + f"runs/{cancelled}", "run")
        assert by_testid(browser, "run-status").text == "awaiting_consent"
        by_testid(browser, "run-cancel").click()
        outcome, status = after_form(browser, "run", "run-status")
        assert outcome in ("cancelling", "cancelled") and status in ("cancelling", "cancelled")
        # The granted Run left the inbox; the cancelled one's consent is no business of an operator's now.
        open_page(browser, base + "consents", "consents")
        assert granted not in [row.get_attribute("data-run-id")
                               for row in browser.find_elements("css selector", '[data-testid="consent-row"]')]


def test_a_failed_job_retried_in_the_browser_is_completed_by_a_worker_and_its_markup_runs_no_script(
    browser: Any, console_url: str, tmp_path: pathlib.Path,
) -> None:
    seeded = _run_async(seed(console_url))
    (tmp_path / "tasks.py").write_text(TASKS, encoding="utf-8")
    job = f"jobs/tasks/{seeded.failed_task}"
    with console_process(console_url, tmp_path) as base:
        fresh_session(browser, base)
        open_page(browser, base + job, "job")
        assert by_testid(browser, "job-status").text == "failed"
        assert by_testid(browser, "job-error").text == HOSTILE_ERROR  # the markup as text, no element made of it
        assert no_alert(browser)
        by_testid(browser, "job-retry").click()
        assert after_form(browser, "job", "job-status") == ("retried", "pending")
        worker = cli("worker", "--app", "tasks:app", "--db", console_url, "--queue", "emails", "--idle-wait", "0.5")
        with process("task-worker", worker, tmp_path, {"TENURE_DB": console_url}) as alive:
            wait_until(lambda: alive() is not None and status_after_reload(browser, base + job, "job-status")
                       == "completed",
                       f"job {seeded.failed_task} completed on its page", browser=browser)
        assert by_testid(browser, "job-result").text != "none"
        assert no_alert(browser)


def test_a_console_with_a_token_sends_the_browser_to_login_and_refuses_a_tampered_csrf_field(
    browser: Any, console_url: str, database: str, screenshots: pathlib.Path, tmp_path: pathlib.Path,
) -> None:
    seeded = _run_async(seed(console_url))
    job = f"jobs/tasks/{seeded.failed_task}"
    with console_process(console_url, tmp_path, token=TOKEN) as base:
        fresh_session(browser, base)
        browser.get(base + job)
        assert page_of(browser) == "login" and "/login" in browser.current_url
        shoot(browser, screenshots, f"{database}-login")
        by_testid(browser, "login-token").send_keys("not-the-token-0123456789")
        by_testid(browser, "login-submit").click()
        wait_until(lambda: browser.find_elements("css selector", '[data-testid="login-refused"]'),
                   "the login page refusing a wrong token", browser=browser)
        assert page_of(browser) == "login"
        by_testid(browser, "login-token").send_keys(TOKEN)
        by_testid(browser, "login-submit").click()
        # Sent back to the page first asked for.
        wait_until(lambda: page_of(browser) == "job", "the job's page after signing in", browser=browser)
        assert TOKEN not in browser.page_source

        browser.execute_script(
            "document.querySelector('#job-retry-form input[name=csrf_token]').value = 'tampered';")
        by_testid(browser, "job-retry").click()
        refused = wait_until(lambda: page_of(browser) == "error" and by_testid(browser, "error-page"),
                             "the refusal of a tampered CSRF field", browser=browser)
        assert refused.get_attribute("data-status") == "403"
        open_page(browser, base + job, "job")
        assert by_testid(browser, "job-status").text == "failed"  # the refused form changed nothing

        by_testid(browser, "job-retry").click()  # the same form untouched is accepted
        assert after_form(browser, "job", "job-status") == ("retried", "pending")

        by_testid(browser, "logout").click()
        wait_until(lambda: page_after_reload(browser, base) == "login", "the login page after signing out",
                   browser=browser)

