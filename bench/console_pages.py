"""Server time of the console's pages with 10^5 jobs and 10^4 Runs (issue 32's target:
list pages <= 200 ms of server time).

    python bench/console_pages.py DB_URL [--jobs 100000] [--runs 10000] [--rounds 15]

DB_URL names an empty database (a new SQLite file, or an empty PostgreSQL database); it is
migrated and seeded through tenure's own API: ``--jobs`` tasks deferred in chunks of 1,000
over two task queues (a tenth of them completed, a tenth failed, the rest pending), and
``--runs`` Runs admitted (a tenth parked on a pending consent, a tenth cancelled). Then a
real ``tenure console --port 0`` process serves the database, and each page is fetched
``--rounds`` times in turn over HTTP; the figure is the server's own time for the page,
read from its ``Server-Timing`` header (the time from the request reaching the app to
the response), so the client's and the network's time are left out. The report gives
the minimum, median and maximum per page. Nothing is asserted: it prints, with the
target beside each list page.

The deep pages follow the "Next page" link (the keyset cursor) a hundred times first, to
show a deep page costs what the first does.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

TARGET_MS = 200.0
NEXT = re.compile(r'href="([^"]*after=[^"]*)"[^>]*data-testid="next-page"|data-testid="next-page"[^>]*href="([^"]*)"')


async def seed(db_url: str, jobs: int, runs: int) -> None:
    from tenure.adapters import InMemoryBroker, RunLedger, TaskApp, upgrade
    from tenure.model import JobStatus, RunIntent, WaitKind, WorkflowPin

    await upgrade(db_url)
    started = time.perf_counter()
    async with TaskApp(db_url) as app:
        @app.task(queue="emails", name="bench.send")
        async def send(ctx: object, n: int) -> None: ...

        @app.task(queue="reports", name="bench.render")
        async def render(ctx: object, n: int) -> None: ...

        for start in range(0, jobs, 1000):
            task = send if (start // 1000) % 2 == 0 else render
            await task.defer_many([{"n": n} for n in range(start, min(start + 1000, jobs))])
        # A tenth completed and a tenth failed, through the fenced API as a worker would.
        source = app.source
        finished = 0
        while finished < jobs // 5:
            claimed = await source.claim_batch_owned("bench", claim_tokens=[f"t{finished}-{i}" for i in range(500)],
                                                     queues=["emails", "reports"])
            if not claimed:
                break
            half = len(claimed) // 2
            await source.complete_many_owned([(job.claim_fence, {}) for job in claimed[:half]])
            for job in claimed[half:]:
                await source.fail_owned(job.claim_fence, "ValueError: bench", retry=False)
            finished += len(claimed)
        counts = {status.value: len(await source.list_tasks(status, limit=10_000)) for status in
                  (JobStatus.COMPLETED, JobStatus.FAILED)}
    print(f"seeded {jobs} tasks in {time.perf_counter() - started:.0f} s ({counts} of the first 10,000 listed)",
          flush=True)
    started = time.perf_counter()
    pin = WorkflowPin("bench", "1", "sha256:" + "b" * 64)
    broker = InMemoryBroker()
    async with RunLedger(db_url) as ledger:
        for n in range(runs):
            admission = await ledger.admit(RunIntent(None, "bench", "ops", frozenset(), {"n": n}), workflow=pin,
                                           queue="runs", priority=50)
            run_id = admission.run.run_id
            if n % 10 == 0:  # parked on a pending consent
                await ledger.publish(run_id, 0, broker)
                await ledger.claim(run_id, 0, node="bench")
                consent = await ledger.consents.create(run_id, tool_name="send_email", tool_call_id=f"call-{n}",
                                                      payload={"to": "ops@example.org"})
                await ledger.park(run_id, 0, kind=WaitKind.CONSENT, owner_id=consent.consent_id)
            elif n % 10 == 1:
                await ledger.begin_cancel(run_id)
    print(f"seeded {runs} Runs in {time.perf_counter() - started:.0f} s", flush=True)


def fetch(base: str, path: str) -> tuple[float, str]:
    with urllib.request.urlopen(base + path, timeout=60) as response:
        timing = response.headers.get("Server-Timing", "")
        body = response.read().decode()
    match = re.search(r"dur=([0-9.]+)", timing)
    assert match is not None, f"no Server-Timing on {path}"
    return float(match.group(1)), body


def deep(base: str, path: str, pages: int) -> str:
    """The path of the page ``pages`` "Next page" links after ``path``."""
    for _ in range(pages):
        _, body = fetch(base, path)
        match = NEXT.search(body)
        if match is None:
            break
        path = (match.group(1) or match.group(2)).replace("&amp;", "&")
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("db_url")
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    arguments = parser.parse_args()
    asyncio.run(seed(arguments.db_url, arguments.jobs, arguments.runs))
    tenure = os.path.join(os.path.dirname(sys.executable), "tenure")
    console = subprocess.Popen([tenure, "console", "--port", "0"], env={**os.environ, "TENURE_DB": arguments.db_url},
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert console.stdout is not None
        first = console.stdout.readline()
        match = re.search(r"http://[0-9.:]+", first)
        assert match is not None, f"the console did not start: {first!r}"
        base = match.group(0)
        pages = {
            "overview /": "/",
            "jobs (tasks, newest first)": "/jobs",
            "jobs ?status=pending": "/jobs?status=pending",
            "jobs ?status=failed": "/jobs?status=failed",
            "jobs ?task_queue=reports": "/jobs?task_queue=reports",
            "runs": "/runs",
            "runs ?status=awaiting_consent": "/runs?status=awaiting_consent",
            "consent inbox": "/consents",
        }
        pages["jobs, 100 pages deep"] = deep(base, "/jobs", 100)
        pages["runs, 100 pages deep"] = deep(base, "/runs", 100)
        times: dict[str, list[float]] = {name: [] for name in pages}
        for _ in range(arguments.rounds):
            for name, path in pages.items():
                times[name].append(fetch(base, path)[0])
    finally:
        console.terminate()
        console.wait(timeout=30)
    kind = "PostgreSQL" if arguments.db_url.startswith("postgres") else "SQLite"
    print(f"\n{kind}, {arguments.jobs:,} tasks, {arguments.runs:,} Runs; server time per page (ms), "
          f"{arguments.rounds} rounds")
    print("| page | min | median | max | target |")
    print("|---|---|---|---|---|")
    for name, seen in times.items():
        target = "" if name.startswith("overview") else f"<= {TARGET_MS:g}"
        print(f"| {name} | {min(seen):.1f} | {statistics.median(seen):.1f} | {max(seen):.1f} | {target} |")


if __name__ == "__main__":
    main()
