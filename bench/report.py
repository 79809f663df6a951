"""Turn the benchmark JSON lines into bench/RESULTS.md and bench/results.png.

    python bench/report.py TENURE_JSONL PEERS_JSONL OUT_DIR [--smoke]

Every ratio is computed from figures measured in the same run. The targets of the
performance issues (12, then 29, whose targets replace 12's where both set one) are checked and marked met or missed; nothing is asserted: a missed
target is a finding to explain, not a failed run. The run fails only when a benchmark
is missing (the harness broke).
"""

from __future__ import annotations

import json
import pathlib
import sys
import textwrap
from typing import Any


def load(path: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.startswith("{")]


def one(records: list[dict[str, Any]], **wanted: Any) -> dict[str, Any]:
    found = [r for r in records if all(r.get(k) == v for k, v in wanted.items())]
    if len(found) != 1:
        raise SystemExit(f"benchmark missing or repeated: {wanted} ({len(found)} found)")
    return found[0]


def verdict(value: float, target: float) -> str:
    return f"{value:.2f}x ({'met' if value >= target else 'missed'}, target >= {target}x)"


def main(tenure_path: str, peers_path: str, out_dir: str, smoke: bool) -> None:
    tenure, peers = load(tenure_path), load(peers_path)
    machine = one(tenure, bench="machine")
    pg = machine["postgresql"]
    lines = [
        "# Benchmark results",
        "",
        "Produced by `bash bench/run.sh`" + (" --smoke (harness check, tiny sizes)" if smoke else "") + ".",
        "Only ratios within this one run mean anything; absolute figures move with the machine.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores']} cores; Python {machine['python']}; SQLite {machine['sqlite']}; "
        f"PostgreSQL {pg['server_version']} on loopback (fsync={pg['fsync']}, synchronous_commit={pg['synchronous_commit']}, "
        f"full_page_writes={pg['full_page_writes']}, shared_buffers={pg['shared_buffers']}).",
        "",
        "## Owned cycle: submit + claim + heartbeat + complete, one job at a time",
        "",
        "Three hand-written asyncpg/psycopg floors do the same fenced work:",
        "",
        "- **floor**: one autocommit statement per step (four round trips per job). Its fenced UPDATE compares the",
        "  lease with a clock read *before* a row-lock wait, so it can accept a write after the lease expired",
        "  (tests/adapters/postgres/test_postgres.py proves it); tenure refuses that write.",
        "- **locked floor**: tenure's guarantee with the fewest round trips asyncpg allows: BEGIN, one statement that",
        "  locks the rows and then reads the clock, a compare-and-set write, COMMIT (sixteen round trips per job).",
        "  It decides in a few lines of Python instead of the kernel and reads nothing back.",
        "- **pipelined locked floor**: the locked floor on psycopg 3 in pipeline mode (BEGIN travels with the lock,",
        "  COMMIT with the write: eight round trips per job), to see what a pipelining driver would buy.",
        "- **lock-first floor**: the floor with its heartbeat and completion in tenure's one-statement shape (a",
        "  MATERIALIZED CTE locks the rows, a second reads the clock after the locks, the UPDATE compares the",
        "  locked lease with it): the guarantee at four round trips per job, written by hand in SQL.",
        "",
        "tenure itself (issue 29): a fenced write is one decided-ahead statement (the kernel decides from the row",
        "last seen with a validity window; the statement locks, reads the clock after the lock and checks the row's",
        "version and the window), a claim is one statement (pick, rewrite and verify), and so is a submission",
        "(replay check, clock and insert): four round trips per job (six before issue 29, when a claim took three).",
        "",
        "locked floor / floor is what the guarantee costs; tenure / locked floor is what tenure costs on top.",
        f"Cycles per second, each the median of {len(one(tenure, bench='cycle', subject='tenure', workers=1)['rounds'])} "
        f"rounds in which the five subjects take turns ({one(tenure, bench='cycle', subject='tenure', workers=1)['jobs']:,} "
        "jobs per round after a warm-up).",
        "",
        "| workers | tenure | floor | locked floor | lock-first floor | pipelined locked floor | tenure / floor | tenure / locked floor | locked floor / floor | lock-first floor / floor |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets: list[str] = []
    for workers in (1, 4, 16):
        mine = one(tenure, bench="cycle", subject="tenure", workers=workers)["cycles_per_second"]
        floor = one(tenure, bench="cycle", subject="floor", workers=workers)["cycles_per_second"]
        locked = one(tenure, bench="cycle", subject="locked_floor", workers=workers)["cycles_per_second"]
        piped = one(tenure, bench="cycle", subject="pipelined_locked_floor", workers=workers)["cycles_per_second"]
        first = one(tenure, bench="cycle", subject="lockfirst_floor", workers=workers)["cycles_per_second"]
        lines.append(f"| {workers} | {mine:,.0f} | {floor:,.0f} | {locked:,.0f} | {first:,.0f} | {piped:,.0f} | {mine / floor:.2f} | "
                     f"{mine / locked:.2f} | {locked / floor:.2f} | {first / floor:.2f} |")
        targets.append(f"- single-job owned cycle at {workers} worker(s) vs floor: {verdict(mine / floor, 0.8)}; "
                       f"vs the locked floor (same guarantee): {mine / locked:.2f}x; vs the lock-first floor: {mine / first:.2f}x")
    per_call_lines, per_call_targets = per_call_section(tenure)
    lines += per_call_lines
    targets += per_call_targets
    burn = {(r["subject"], r["batch"]): r for r in tenure if r["bench"] == "burn_down"}
    burn_workers = burn[("tenure", 1)]["workers"]
    peer = {(r["peer"], r["batch"]): r for r in peers if r["bench"] == "burn_down" and r["workers"] == burn_workers}
    jobs = burn[("tenure", 1)]["jobs"]
    lines += [
        "",
        f"## No-op burn-down: {jobs:,} waiting jobs claimed and completed by {burn_workers} workers (after a warm-up)",
        "",
        f"Jobs per second, each the median of {len(burn[('tenure', 1)]['rounds'])} rounds in which the subjects take "
        "turns (tenure and its floors in one process, then the peers in theirs); every round's figure is listed.",
        "tenure and its floors here are hand-written loops over the source calls (one source per worker); the peers",
        f"are their own worker loops (the same runs as their concurrency-{burn_workers} figures under Workers below).",
        "",
        "| queue | batch | jobs/s | rounds | tenure single / it | tenure batch 10 / it |",
        "|---|---|---|---|---|---|",
    ]
    single = burn[("tenure", 1)]["jobs_per_second"]
    batched = burn[("tenure", 10)]["jobs_per_second"]
    labelled = [("tenure (owned, fenced)", burn[("tenure", b)]) for b in (1, 10)]
    labelled += [("asyncpg floor (fenced, one statement per step)", burn[("floor", b)]) for b in (1, 10)]
    labelled += [("asyncpg locked floor (tenure's guarantee)", burn[("locked_floor", b)]) for b in (1, 10)]
    labelled += [("asyncpg lock-first floor (the guarantee, one statement)", burn[("lockfirst_floor", b)]) for b in (1, 10)]
    labelled += [("psycopg pipelined locked floor", burn[("pipelined_locked_floor", b)]) for b in (1, 10)]
    labelled += [(name, record) for (name, _), record in sorted(peer.items())]
    rows = [(name, record["batch"], record["jobs_per_second"]) for name, record in labelled]
    for name, record in labelled:
        rate = record["jobs_per_second"]
        measured = ", ".join(f"{value:,.0f}" for value in record["rounds"])
        lines.append(f"| {name} | {record['batch']} | {rate:,.0f} | {measured} | {single / rate:.2f} | {batched / rate:.2f} |")
    targets += [
        f"- batched owned cycle (batch 10) vs batched floor: {verdict(batched / burn[('floor', 10)]['jobs_per_second'], 0.6)}; "
        f"vs the batched locked floor (same guarantee): {batched / burn[('locked_floor', 10)]['jobs_per_second']:.2f}x",
        f"- batched owned cycle (batch 10) vs pgqueuer batch 10: {verdict(batched / peer[('pgqueuer', 10)]['jobs_per_second'], 1.0)}",
        f"- single-job owned cycle vs procrastinate: {verdict(single / peer[('procrastinate', 1)]['jobs_per_second'], 3.0)}",
        f"- single-job owned cycle vs saq: {verdict(single / peer[('saq', 1)]['jobs_per_second'], 3.0)}",
    ]
    worker_lines, worker_targets, worker_rows = workers_section(tenure, peers)
    lines += worker_lines
    targets += worker_targets
    lines += ["", "## Claim latency (one owned claim, PostgreSQL)", "",
              "| waiting rows | median ms | p99 ms |", "|---|---|---|"]
    latencies = sorted((r for r in tenure if r["bench"] == "claim_latency"), key=lambda r: r["waiting_rows"])
    for record in latencies:
        lines.append(f"| {record['waiting_rows']:,} | {record['median_ms']:.3f} | {record['p99_ms']:.3f} |")
    if len(latencies) >= 2:
        growth = latencies[-1]["median_ms"] / latencies[0]["median_ms"]
        targets.append(
            f"- claim latency (median) at {latencies[-1]['waiting_rows']:,} waiting rows vs {latencies[0]['waiting_rows']:,}: "
            f"{growth:.2f}x ({'met' if growth <= 1.2 else 'missed'}, target <= 1.2x)"
        )
    task_lines, task_targets = tasks_section(tenure, peers)
    lines += task_lines
    targets += task_targets
    seed_lines, seed_targets = pycharter_section(tenure)
    lines += seed_lines
    targets += seed_targets
    runs_lines, runs_targets = runs_section(tenure)
    lines += runs_lines
    targets += runs_targets
    sqlite_cycle = one(tenure, bench="sqlite_cycle")
    lines += ["", "## SQLite owned cycle", "",
              f"tenure {sqlite_cycle['tenure_per_second']:,.0f} cycles/s, raw `sqlite3` floor {sqlite_cycle['floor_per_second']:,.0f} "
              f"cycles/s (journal {sqlite_cycle['journal']}, synchronous {sqlite_cycle['synchronous']}): "
              f"{sqlite_cycle['tenure_per_second'] / sqlite_cycle['floor_per_second']:.2f}x."]
    targets.append(f"- SQLite owned cycle vs raw sqlite3: "
                   f"{verdict(sqlite_cycle['tenure_per_second'] / sqlite_cycle['floor_per_second'], 0.5)}")
    kernel = [r for r in tenure if r["bench"] == "kernel"]
    lines += ["", "## Kernel and fingerprint", "", "| measure | value |", "|---|---|"]
    for record in kernel:
        lines.append(f"| kernel decision, {record['command']} | {record['microseconds']:.2f} us |")
        targets.append(f"- kernel decision ({record['command']}): {record['microseconds']:.2f} us "
                       f"({'met' if record['microseconds'] < 10 else 'missed'}, target < 10 us)")
    fingerprint = one(tenure, bench="fingerprint")
    lines += [
        f"| json.dumps + sha256 of {fingerprint['payload_bytes']:,} bytes (floor) | {fingerprint['floor_ms']:.2f} ms |",
        f"| fingerprint of a constructed envelope (snapshot_submission) | {fingerprint['snapshot_ms']:.2f} ms |",
        f"| envelope from a plain dict + fingerprint | {fingerprint['envelope_and_snapshot_ms']:.2f} ms |",
    ]
    targets.append(f"- fingerprint of a constructed envelope vs floor: "
                   f"{verdict(fingerprint['floor_ms'] / fingerprint['snapshot_ms'], 0.8)}")
    targets.append(f"- envelope construction + fingerprint vs floor (not a target, the whole path): "
                   f"{fingerprint['floor_ms'] / fingerprint['envelope_and_snapshot_ms']:.2f}x")
    lines += before_and_after(tenure, peers, pathlib.Path(__file__).with_name("before_issue29.json"))
    lines += issue_51_so_far(tenure, pathlib.Path(__file__).with_name("before_issue51.json"),
                             pathlib.Path(out_dir) / "call_counts.json")
    lines += ["", "## Targets", "", *targets, "", "![jobs per second](results.png)", ""]
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines += kept_sections(out / "RESULTS.md")
    (out / "RESULTS.md").write_text("\n".join(lines))
    chart(rows, out / "results.png", jobs, burn_workers, worker_rows)
    print("\n".join(lines))


STEPS = ("submit", "claim", "heartbeat", "complete")


def rate_cell(record: dict[str, Any] | None) -> str:
    """A burn-down's median jobs/s, with the lowest-highest of its rounds when several."""
    if record is None:
        return "-"
    low, high = min(record["rounds"]), max(record["rounds"])
    spread = f" ({low:,.0f}-{high:,.0f})" if len(record["rounds"]) > 1 else ""
    return f"{record['jobs_per_second']:,.0f}{spread}"


def tasks_section(tenure: list[dict[str, Any]], peers: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Tasks (TaskApp on tenure_tasks) drained by their Worker beside the peers' burn-downs
    at the same concurrency, the deferral rate, and the task claim latency."""
    mine = {(r["concurrency"], r["batch"]): r for r in tenure if r["bench"] == "task_worker"}
    if not mine:
        raise SystemExit("task benchmark missing (tenure_bench.py --only task_worker)")
    theirs = {(r["peer"], r["batch"], r["workers"]): r for r in peers if r["bench"] == "burn_down"}
    jobs = next(iter(mine.values()))["jobs"]
    defer = one(tenure, bench="task_defer")

    lines = [
        "", f"## Tasks: {jobs:,} waiting no-op tasks drained by a TaskApp's Worker", "",
        "tenure: `app.worker(concurrency=C, batch_size=B).run_until_idle()` on a TaskApp with one registered",
        "no-op task (claimed from `tenure_tasks` by queue and priority, fenced, completed with its exact fence),",
        "after a warm-up drained by its own Worker; the tasks are deferred with `defer_many` (not timed here:",
        f"{defer['jobs_per_second']:,.0f} tasks/s, 1,000 per transaction). The peers: the same burn-down runs as",
        "under Workers above, at the same concurrency. Jobs per second, median (lowest-highest).", "",
        "| system | concurrency | batch | jobs/s | tenure tasks (batch 1) / system | tenure tasks (batch 10) / system |",
        "|---|---|---|---|---|---|",
    ]
    targets: list[str] = []
    for concurrency in sorted({c for c, _ in mine}):
        single, batched = mine.get((concurrency, 1)), mine.get((concurrency, 10))
        rows = [(f"tenure tasks, batch {b}", b, mine.get((concurrency, b))) for b in (1, 10)]
        rows += [(name, b, theirs.get((peer, b, concurrency))) for name, peer, b in (
            ("procrastinate", "procrastinate", 1), ("saq", "saq", 1), ("pgqueuer", "pgqueuer", 1),
            ("pgqueuer", "pgqueuer", 10))]
        for name, b, record in rows:
            if record is None:
                continue
            ratios = [f"{ours['jobs_per_second'] / record['jobs_per_second']:.2f}" if ours else "-"
                      for ours in (single, batched)]
            lines.append(f"| {name} | {concurrency} | {b} | {rate_cell(record)} | {ratios[0]} | {ratios[1]} |")
        procrastinate = theirs.get(("procrastinate", 1, concurrency))
        best = max((r for r in (single, batched) if r), key=lambda r: r["jobs_per_second"])
        if procrastinate is not None:
            ratio = best["jobs_per_second"] / procrastinate["jobs_per_second"]
            targets.append(f"- task burn-down at concurrency {concurrency} (batch {best['batch']}) vs procrastinate: "
                           f"{verdict(ratio, 2.0)}")
    latencies = sorted((r for r in tenure if r["bench"] == "task_claim_latency"),
                       key=lambda r: (r.get("queues", 1), r["waiting_rows"]))
    if latencies:
        lines += ["", "Task claim latency (one claim; 90% of the waiting tasks in the claimed queue, over 101 priorities):",
                  "", "| waiting tasks | queues claimed | median ms | p99 ms |", "|---|---|---|---|"]
        lines += [f"| {r['waiting_rows']:,} | {r.get('queues', 1)} | {r['median_ms']:.3f} | {r['p99_ms']:.3f} |"
                  for r in latencies]
        for queues in sorted({r.get("queues", 1) for r in latencies}):
            series = [r for r in latencies if r.get("queues", 1) == queues]
            if len(series) >= 2:
                growth = series[-1]["median_ms"] / series[0]["median_ms"]
                targets.append(f"- task claim latency ({queues} queue{'s' if queues > 1 else ''}) at "
                               f"{series[-1]['waiting_rows']:,} vs {series[0]['waiting_rows']:,} waiting: {growth:.2f}x "
                               f"({'met' if growth <= 1.2 else 'missed'}, target <= 1.2x: flat)")
    return lines, targets


KEPT_SECTIONS = ("## Explorer vs sampling",)
"""Sections of RESULTS.md another script measures (``bench/explorer_vs_sampling.py``):
carried over from the file being replaced, each from its heading to the next ``## ``."""


def kept_sections(path: pathlib.Path) -> list[str]:
    """The lines of each :data:`KEPT_SECTIONS` section in the RESULTS.md being replaced."""
    if not path.exists():
        return []
    kept: list[str] = []
    keeping = False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            keeping = line.startswith(KEPT_SECTIONS)
            if keeping:
                kept.append("")
        if keeping:
            kept.append(line)
    return kept


def before_and_after(tenure: list[dict[str, Any]], peers: list[dict[str, Any]], before_path: pathlib.Path) -> list[str]:
    """Issue 29's before figures (from the issue, a run on main before its work) beside
    this run's: different runs, so compare ratios, not absolute figures."""
    before = json.loads(before_path.read_text())
    cycle = {w: one(tenure, bench="cycle", subject="tenure", workers=w)["cycles_per_second"]
             / one(tenure, bench="cycle", subject="floor", workers=w)["cycles_per_second"] for w in (1, 4, 16)}
    cpu = {(r["subject"], r["step"]): r["cpu_us"] for r in tenure if r["bench"] == "per_call"}
    worker = {r["concurrency"]: r["jobs_per_second"] for r in tenure if r["bench"] == "worker" and r["batch"] == 1}
    worker_10 = {r["concurrency"]: r["jobs_per_second"] for r in tenure if r["bench"] == "worker" and r["batch"] == 10}
    peer = {(r["peer"], r["batch"], r["workers"]): r["jobs_per_second"] for r in peers if r["bench"] == "burn_down"}
    sqlite_cycle = one(tenure, bench="sqlite_cycle")
    runs = [r for r in tenure if r["bench"] == "runs"]
    latencies = sorted((r for r in tenure if r["bench"] == "claim_latency"), key=lambda r: r["waiting_rows"])
    if len(latencies) < 2:
        raise SystemExit("claim latency benchmark missing")

    def ratios(values: dict[int, float]) -> str:
        return " / ".join(f"{values[c]:.2f}" for c in sorted(values))

    def runs_ratio(c: int) -> str:
        found = [r["runs_on_saq"] / r["saq"] for r in runs if r["concurrency"] == c]
        return f"{min(found):.2f}" if min(found) == max(found) else f"{min(found):.2f}-{max(found):.2f}"

    concurrencies = sorted(worker)
    rows = [
        ("owned cycle / floor, 1 / 4 / 16 workers", " / ".join(before["cycle_vs_floor"][str(w)] for w in (1, 4, 16)),
         ratios(cycle), ">= 0.8"),
        ("round trips per owned cycle (PostgreSQL; counted, not timed)", before["round_trips_per_cycle"],
         "4 (claim 1)", ""),
        *((f"client CPU per {step}, us (floor this run: {cpu[('floor', step)]:,.0f})", before["cpu_us"][step],
           f"{cpu[('tenure', step)]:,.0f}", f"<= {1.5 * cpu[('floor', step)]:,.0f}") for step in STEPS),
        ("client CPU per cycle, us", before["cpu_us"]["cycle"], f"{sum(cpu[('tenure', step)] for step in STEPS):,.0f}",
         f"<= {1.5 * sum(cpu[('floor', step)] for step in STEPS):,.0f}"),
        ("Worker / procrastinate, " + " / ".join(f"c{c}" for c in concurrencies),
         " / ".join(before["worker_vs_procrastinate"][str(c)] for c in concurrencies),
         ratios({c: worker[c] / peer[("procrastinate", 1, c)] for c in concurrencies}), ">= 2 at c4, c16"),
        ("Worker / saq", " / ".join(before["worker_vs_saq"][str(c)] for c in concurrencies),
         ratios({c: worker[c] / peer[("saq", 1, c)] for c in concurrencies}), ">= 2 at c4, c16"),
        ("Worker / pgqueuer batch 1", " / ".join(before["worker_vs_pgqueuer_batch_1"][str(c)] for c in concurrencies),
         ratios({c: worker[c] / peer[("pgqueuer", 1, c)] for c in concurrencies}), ">= 1.0"),
        ("Worker batch 10 / pgqueuer batch 10, c16", before["worker_batch_10_vs_pgqueuer_batch_10"]["16"],
         f"{worker_10[16] / peer[('pgqueuer', 10, 16)]:.2f}" if 16 in worker_10 else "-", ">= 0.7"),
        ("SQLite owned cycle / raw sqlite3", before["sqlite_vs_raw"],
         f"{sqlite_cycle['tenure_per_second'] / sqlite_cycle['floor_per_second']:.2f}", ">= 0.5"),
        ("Runs on SAQ / plain SAQ, c1 / c4 / c16", " / ".join(before["runs_on_saq_vs_saq"][str(c)] for c in (1, 4, 16)),
         " / ".join(runs_ratio(c) for c in (1, 4, 16)), ">= 0.8"),
        ("reconcile after a dead node, Runs/s", before["reconcile_runs_per_second"],
         f"{one(tenure, bench='recovery', **{'pass': 'reconcile'})['runs_per_second']:,.0f}", ">= 1,000"),
        (f"claim latency at {latencies[-1]['waiting_rows']:,} waiting rows / at {latencies[0]['waiting_rows']:,}",
         before["claim_latency_growth"], f"{latencies[-1]['median_ms'] / latencies[0]['median_ms']:.2f}", "<= 1.2"),
    ]
    lines = ["", "## Before and after issue 29", "", f"Before: {before['source']}. After: this run. The two are different "
             "runs on a noisy shared machine: compare the ratios.", "",
             "| measure | before | after | target |", "|---|---|---|---|"]
    lines += [f"| {name} | {was} | {now} | {target} |" for name, was, now, target in rows]
    return lines


def issue_51_so_far(tenure: list[dict[str, Any]], before_path: pathlib.Path, counts_path: pathlib.Path) -> list[str]:
    """Issue 51's figures as filed beside this run's: Python calls per call (counted by
    bench/call_counts.py, deterministic: ``call_counts.json`` beside the report, written
    by bench/run.sh after the timed runs) and client CPU per call against the floor."""
    before = json.loads(before_path.read_text())
    counts = json.loads(counts_path.read_text()) if counts_path.is_file() else None
    cpu = {(r["subject"], r["step"]): r["cpu_us"] for r in tenure if r["bench"] == "per_call"}
    cycle = {w: one(tenure, bench="cycle", subject="tenure", workers=w)["cycles_per_second"]
             / one(tenure, bench="cycle", subject="floor", workers=w)["cycles_per_second"] for w in (1, 4, 16)}
    lines = ["", "## Issue 51 so far: Python calls and client CPU per call", "",
             f"Before: {before['source']}; stop 60: main 3a4bc17, counted the same way. Calls are counted, not "
             "timed (the same on any machine); the CPU ratios are this run's.", "",
             "| call | calls as filed | calls at stop 60 | calls now | floor calls | target | "
             "CPU / floor as filed | CPU / floor now | target |", "|---|---|---|---|---|---|---|---|---|"]
    for step in (*STEPS, "claim + complete of 10"):
        now = f"{counts['tenure'][step]:,.0f}" if counts else "not counted"
        floor = f"{counts['floor'][step]:,.0f}" if counts else "-"
        target = {"heartbeat": "<= 60", "complete": "<= 60", "claim": "<= 80"}.get(step, "")
        ratio = f"{cpu[('tenure', step)] / cpu[('floor', step)]:.2f}" if ("tenure", step) in cpu else "-"
        lines.append(f"| {step} | {before['calls'][step]} | {before['calls_stop_60'][step]} | {now} | {floor} | {target} | "
                     f"{before['cpu_vs_floor'].get(step, '-')} | {ratio} | {'<= 1.5' if step in STEPS else ''} |")
    lines += ["", "Owned cycle / single-statement floor, 1 / 4 / 16 workers: as filed "
              + " / ".join(before["cycle_vs_floor"][str(w)] for w in (1, 4, 16)) + "; this run "
              + " / ".join(f"{cycle[w]:.2f}" for w in (1, 4, 16)) + " (target >= 0.8)."]
    return lines


def per_call_section(tenure: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Client CPU and wall time per owned call, tenure beside the floors."""
    calls = {(r["subject"], r["step"]): r for r in tenure if r["bench"] == "per_call"}
    subjects = ("tenure", "floor", "lockfirst_floor")
    if any((subject, step) not in calls for subject in subjects for step in STEPS):
        raise SystemExit(f"per-call benchmark missing: {sorted(calls)}")
    sample = calls[("tenure", "submit")]
    lines = [
        "",
        "## Per call: client CPU and wall time of one owned call at a time (PostgreSQL)",
        "",
        f"One worker, one connection, {sample['jobs']:,} cycles per round after a warm-up; each step timed on its own",
        "with `time.process_time` (this process's CPU: the client's cost, the steadiest figure on a shared machine) and",
        f"`time.perf_counter`; the median of {len(sample['cpu_rounds'])} round(s) in which the subjects take turns, each "
        "on a fresh database. The server's CPU is not counted.",
        "",
        "| call | tenure CPU us | floor CPU us | lock-first floor CPU us | tenure / floor (CPU) | tenure wall us | floor wall us |",
        "|---|---|---|---|---|---|---|",
    ]
    targets = []
    for step in STEPS:
        mine, floor, first = (calls[(subject, step)] for subject in subjects)
        ratio = mine["cpu_us"] / floor["cpu_us"]
        lines.append(f"| {step} | {mine['cpu_us']:,.0f} | {floor['cpu_us']:,.0f} | {first['cpu_us']:,.0f} | {ratio:.2f} | "
                     f"{mine['wall_us']:,.0f} | {floor['wall_us']:,.0f} |")
        targets.append(f"- client CPU per {step} vs the floor's: {ratio:.2f}x "
                       f"({'met' if ratio <= 1.5 else 'missed'}, target <= 1.5x)")
    mine_total = sum(calls[("tenure", step)]["cpu_us"] for step in STEPS)
    floor_total = sum(calls[("floor", step)]["cpu_us"] for step in STEPS)
    lines.append(f"| whole cycle | {mine_total:,.0f} | {floor_total:,.0f} | "
                 f"{sum(calls[('lockfirst_floor', step)]['cpu_us'] for step in STEPS):,.0f} | {mine_total / floor_total:.2f} | "
                 f"{sum(calls[('tenure', step)]['wall_us'] for step in STEPS):,.0f} | "
                 f"{sum(calls[('floor', step)]['wall_us'] for step in STEPS):,.0f} |")
    return lines, targets


def pycharter_section(tenure: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """pycharter 0.0.67's own cycle beside tenure's owned cycle of the same run."""
    theirs = {r["workers"]: r for r in tenure if r["bench"] == "pycharter_cycle"}
    if not theirs:
        raise SystemExit("pycharter cycle benchmark missing")
    lines = [
        "",
        "## The seed's own system: pycharter 0.0.67's cycle",
        "",
        "pycharter's `ValidationJobSource` (its tables from its own `pycharter db init`) driven as its worker drives it:",
        "`submit`, `claim_next`, `heartbeat`, `complete` per job, each its own transaction on a thread",
        "(bench/pycharter_cycle.py, in pycharter's own environment, right after the peers, against the same server);",
        "it completes by job ID alone. tenure's figure is the owned cycle above (same run, not interleaved).",
        "",
        "| workers | tenure cycles/s | pycharter cycles/s (rounds) | tenure / pycharter |",
        "|---|---|---|---|",
    ]
    targets = []
    for workers, record in sorted(theirs.items()):
        mine = one(tenure, bench="cycle", subject="tenure", workers=workers)["cycles_per_second"]
        rounds = ", ".join(f"{value:,.0f}" for value in record["rounds"])
        lines.append(f"| {workers} | {mine:,.0f} | {record['cycles_per_second']:,.0f} ({rounds}) | "
                     f"{mine / record['cycles_per_second']:.2f} |")
        targets.append(f"- owned cycle at {workers} worker(s) vs pycharter 0.0.67's own cycle: "
                       f"{verdict(mine / record['cycles_per_second'], 3.0)}")
    return lines, targets


def runs_section(tenure: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """No-op single-hop Runs on each broker beside plain SAQ and Absurd; reconciliation."""
    runs = [r for r in tenure if r["bench"] == "runs"]
    absurd = {r["concurrency"]: r for r in tenure if r["bench"] == "absurd_tasks"}
    recovery = {r["pass"]: r for r in tenure if r["bench"] == "recovery"}
    concurrencies = sorted({r["concurrency"] for r in runs})
    if not runs or set(absurd) != set(concurrencies) or "reconcile" not in recovery:
        raise SystemExit("Runs, Absurd or recovery benchmark missing")

    def spread(values: list[float], digits: int = 0) -> str:
        low, high = min(values), max(values)
        return f"{low:,.{digits}f}" if low == high else f"{low:,.{digits}f}-{high:,.{digits}f}"

    by: dict[int, list[dict[str, Any]]] = {c: [r for r in runs if r["concurrency"] == c] for c in concurrencies}
    lines = [
        "",
        "## Runs: no-op single-hop Runs beside plain SAQ and Absurd (PostgreSQL)",
        "",
        f"bench/runs.py: {runs[0]['items']:,} Runs per case, admitted and published before the clock starts, one",
        "`RunWorker` until every Run is DONE (each hop: claim, workflow, settle, checkpoint cleanup), on SAQ",
        "(`SaqBroker`), on tenure's own queue in the same database (`QueueBroker`) and on an in-memory broker (the",
        "ledger alone); plain SAQ runs the same number of no-op jobs with its own worker. bench/absurd_tasks.py:",
        "Absurd 0.5's own async worker (claim batch = concurrency) running as many one-step tasks (one checkpointed",
        f"`ctx.step`), in the peers' environment after the Runs. Items per second; the range over {len(by[concurrencies[0]])} "
        "round(s): tenure's cases and plain SAQ take turns in each round; Absurd's rounds run after them.",
        "",
        "| concurrency | Runs, in-memory broker | Runs on QueueBroker | Runs on SAQ | plain SAQ | Runs on SAQ / SAQ | Absurd one-step tasks | QueueBroker / Absurd |",
        "|---|---|---|---|---|---|---|---|",
    ]
    targets = []
    for c in concurrencies:
        rounds = by[c]
        ratios = [r["runs_on_saq"] / r["saq"] for r in rounds]
        queue_median = sorted(r["runs_on_queue"] for r in rounds)[len(rounds) // 2]
        saq_median = sorted(r["runs_on_saq"] for r in rounds)[len(rounds) // 2]
        versus_absurd = queue_median / absurd[c]["tasks_per_second"]
        lines.append(
            f"| {c} | {spread([r['memory'] for r in rounds])} | {spread([r['runs_on_queue'] for r in rounds])} | "
            f"{spread([r['runs_on_saq'] for r in rounds])} | {spread([r['saq'] for r in rounds])} | {spread(ratios, 2)} | "
            f"{spread(absurd[c]['rounds'])} | {versus_absurd:.2f} |")
        targets.append(f"- Runs on SAQ vs plain SAQ at concurrency {c}: {spread(ratios, 2)}x over the rounds "
                       f"({'met' if min(ratios) >= 0.8 else 'missed'}, target >= 0.8x)")
        targets.append(f"- Runs on QueueBroker at concurrency {c} (median {queue_median:,.0f}/s) vs Runs on SAQ "
                       f"({saq_median:,.0f}/s): {verdict(queue_median / saq_median, 1.0)}; vs Absurd one-step tasks "
                       f"({absurd[c]['tasks_per_second']:,.0f}/s): {verdict(versus_absurd, 1.0)}")
    reconcile = recovery["reconcile"]
    lines += ["", f"Startup reconciliation after a dead node (bench/recovery.py, {reconcile['runs']:,} Runs, in-memory "
              f"broker): {reconcile['runs_per_second']:,.0f} Runs/s, {reconcile['cpu_us_per_run']:,.0f} us of client CPU per Run"
              + (f"; relay rounds over the Runs it left queued: {recovery['relay']['runs_per_second']:,.0f} Runs/s."
                 if "relay" in recovery else ".")]
    costs = [r["costs"] for r in runs if "costs" in r]
    if costs:  # issue 49: statements (round trips on PostgreSQL) and client CPU per Run, counted
        for case, label in (("memory", "in-memory broker"), ("runs_on_queue", "QueueBroker")):
            figures = [c[case] for c in costs]
            lines.append(f"Statements per single-hop Run, {label}: {spread([f['statements'] for f in figures], 1)} "
                         f"(admit {spread([f['admit'] for f in figures], 1)}, publish "
                         f"{spread([f['publish'] for f in figures], 1)}, hop {spread([f['hop'] for f in figures], 1)}); "
                         f"client CPU {spread([f['cpu_us'] for f in figures])} us per Run.")
    if "statements_per_run" in reconcile:
        lines.append(f"Statements per reconciled Run: {reconcile['statements_per_run']:.2f}"
                     + (f"; per relayed Run: {recovery['relay']['statements_per_run']:.2f}." if "relay" in recovery
                        else "."))
    met = reconcile["runs_per_second"] >= 1000
    targets.append(f"- reconcile after a dead node: {reconcile['runs_per_second']:,.0f} Runs/s "
                   f"({'met' if met else 'missed'}, target >= 1,000 Runs/s)")
    return lines, targets


def workers_section(tenure: list[dict[str, Any]], peers: list[dict[str, Any]]
                    ) -> tuple[list[str], list[str], list[tuple[str, dict[int, float]]]]:
    """The fenced worker runtime end to end beside the peers' own worker loops: the
    section's lines, its targets, and (label, {concurrency: jobs/s}) rows for the chart."""
    mine = {(r["concurrency"], r["batch"]): r for r in tenure if r["bench"] == "worker"}
    theirs = {(r["peer"], r["batch"], r["workers"]): r for r in peers if r["bench"] == "burn_down"}
    concurrencies = sorted({c for c, _ in mine})
    if not mine or any((peer, batch, c) not in theirs for c in concurrencies
                       for peer, batch in (("procrastinate", 1), ("saq", 1), ("pgqueuer", 1), ("pgqueuer", 10))):
        raise SystemExit(f"worker benchmark missing: tenure {sorted(mine)}, peers {sorted(theirs)}")
    jobs = next(iter(mine.values()))["jobs"]
    rounds = {c: len(mine[(c, 1)]["rounds"]) for c in concurrencies}
    for record in [*mine.values(), *theirs.values()]:
        if record["jobs"] != jobs:
            raise SystemExit(f"worker benchmark with another job count: {record}")

    systems: list[tuple[str, dict[int, dict[str, Any]]]] = [
        ("tenure Worker (fenced), batch 1", {c: mine[(c, 1)] for c in concurrencies if (c, 1) in mine}),
        ("tenure Worker (fenced), batch 10", {c: mine[(c, 10)] for c in concurrencies if (c, 10) in mine}),
        ("procrastinate", {c: theirs[("procrastinate", 1, c)] for c in concurrencies}),
        ("saq", {c: theirs[("saq", 1, c)] for c in concurrencies}),
        ("pgqueuer, batch 1", {c: theirs[("pgqueuer", 1, c)] for c in concurrencies}),
        ("pgqueuer, batch 10", {c: theirs[("pgqueuer", 10, c)] for c in concurrencies}),
    ]
    lines = [
        "",
        f"## Workers: {jobs:,} waiting no-op jobs drained by each system's own worker loop",
        "",
        "tenure: one `tenure.adapters.Worker` per run (`run_until_idle`, a no-op handler returning None, so every",
        "job is claimed with a fresh nonce, its lease timed locally and completed with its exact fence; completions",
        "that finish together go out as one `complete_many_owned`) on one `ValidationJobSource` (its pool holds at",
        "most 10 connections), after a warm-up of real `submit_owned` submissions drained by its own Worker; the",
        "measured jobs are inserted as owned rows by SQL. The peers: one procrastinate worker (`concurrency=C`,",
        "`wait=False`), one saq Worker (`concurrency=C`, burst mode) and C pgqueuer QueueManagers (one connection",
        "each, drain mode, batch 1 or 10), each after its own warm-up; a run that stops early is run again inside",
        "the timed window until the peer's table shows nothing unfinished.",
        "Reading the columns: the tenure Worker keeps at most four claim calls in flight (each of up to",
        "`batch_size` jobs, each one statement: pick, rewrite and verify), so at batch 1 its claims,",
        "not its concurrency, bound it;",
        "a pgqueuer QueueManager does not cap its in-flight jobs (no `max_concurrent_tasks` given) and writes",
        "completions through a buffer flushed every `batch_size` jobs.",
        "Jobs per second, the median of "
        + (f"{next(iter(rounds.values()))} round(s)" if len(set(rounds.values())) == 1 else
           ", ".join(f"{count} round{'s' if count > 1 else ''} at concurrency {c}" for c, count in rounds.items()))
        + " (lowest-highest in brackets when there are several; one round where",
        "the full run's time allows no more); the systems take turns in each round (tenure in one process, then the",
        "peers in theirs, against the same server). Every run drains the same number of jobs.",
        "",
        "| system | " + " | ".join(f"concurrency {c}" for c in concurrencies) + " |",
        "|---|" + "---|" * len(concurrencies),
    ]
    for name, by_concurrency in systems:
        lines.append(f"| {name} | " + " | ".join(rate_cell(by_concurrency.get(c)) for c in concurrencies) + " |")
    lines += ["", "tenure Worker (batch 1) / peer, same concurrency:", "",
              "| peer | " + " | ".join(f"concurrency {c}" for c in concurrencies) + " |",
              "|---|" + "---|" * len(concurrencies)]
    for name, by_concurrency in systems[2:]:
        lines.append(f"| {name} | " + " | ".join(
            f"{mine[(c, 1)]['jobs_per_second'] / by_concurrency[c]['jobs_per_second']:.2f}x" for c in concurrencies) + " |")
    targets = []
    for c in concurrencies:
        rate = mine[(c, 1)]["jobs_per_second"]
        against = {name: theirs[key]["jobs_per_second"] for name, key in
                   (("procrastinate", ("procrastinate", 1, c)), ("saq", ("saq", 1, c)), ("pgqueuer", ("pgqueuer", 1, c)))}
        targets.append(
            f"- fenced Worker (batch 1) at concurrency {c} ({rate:,.0f} jobs/s): vs procrastinate ({against['procrastinate']:,.0f}) "
            f"{verdict(rate / against['procrastinate'], 2.0)}; vs saq ({against['saq']:,.0f}) {verdict(rate / against['saq'], 2.0)}; "
            f"vs pgqueuer batch 1 ({against['pgqueuer']:,.0f}) {verdict(rate / against['pgqueuer'], 1.0)}")
    for (c, batch), record in sorted(mine.items()):
        if batch == 1:
            continue
        pgqueuer = theirs[("pgqueuer", 10, c)]["jobs_per_second"]
        targets.append(f"- fenced Worker batch {batch} at concurrency {c} ({record['jobs_per_second']:,.0f} jobs/s) vs pgqueuer "
                       f"batch 10 ({pgqueuer:,.0f}): {verdict(record['jobs_per_second'] / pgqueuer, 0.7)}")

    latency = [r for r in tenure if r["bench"] == "worker_latency"]
    peer_latency = sorted((r for r in peers if r["bench"] == "latency"), key=lambda r: r["peer"])
    if len(latency) != 1:
        raise SystemExit(f"worker latency missing or repeated ({len(latency)} found)")
    ours = latency[0]
    lines += [
        "",
        "### Submit-to-start latency with an idle worker (PostgreSQL)",
        "",
        f"One job submitted at a time, {ours['spacing_ms']:.0f} ms after the previous one started, to an idle worker",
        "with concurrency 1 whose fallback poll is 5 s (so only a notification makes it faster); the time from just",
        "before the submit (enqueue) call to the handler's first line, in the same process. "
        f"{ours['samples']} samples after a warm-up.",
        "",
        "| system | wake-up | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
        f"| tenure Worker | LISTEN, NOTIFY in the submitting transaction (listening: {ours['listening']}) | "
        f"{ours['p50_ms']:.2f} | {ours['p99_ms']:.2f} | {ours['max_ms']:.2f} |",
    ]
    for record in peer_latency:
        lines.append(f"| {record['peer']} | {record['wake_up']} | {record['p50_ms']:.2f} | {record['p99_ms']:.2f} | "
                     f"{record['max_ms']:.2f} |")
    lines += ["", f"tenure's p50 splits into `submit_owned` itself ({ours['submit_p50_ms']:.2f} ms: one statement: "
              f"replay check, clock, INSERT and NOTIFY) and notification + claim + handler start ({ours['wake_p50_ms']:.2f} ms)."]
    met = ours["listening"] and ours["p50_ms"] <= 20
    targets.append(f"- Worker submit-to-start latency p50 on PostgreSQL with NOTIFY: {ours['p50_ms']:.2f} ms "
                   f"(p99 {ours['p99_ms']:.2f} ms; {'met' if met else 'missed'}, target <= 20 ms"
                   f"{'' if ours['listening'] else '; the worker was not listening'})")
    chart_rows = [(name, {c: record["jobs_per_second"] for c, record in by_concurrency.items()})
                  for name, by_concurrency in systems]
    return lines, targets, chart_rows


def chart(rows: list[tuple[str, int, float]], path: pathlib.Path, jobs: int, workers: int,
          worker_rows: list[tuple[str, dict[int, float]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (axis, worker_axis) = plt.subplots(2, 1, figsize=(13, 9.6))
    labels = [textwrap.fill(name.split(" (")[0], 14) + f"\nbatch {batch}" for name, batch, _ in rows]
    rates = [rate for _, _, rate in rows]
    colours = ["#2b6cb0" if name.startswith("tenure") else "#a0aec0" if "floor" in name else "#ed8936" for name, _, _ in rows]
    axis.bar(labels, rates, color=colours)
    axis.set_ylabel("jobs per second")
    axis.set_title(f"No-op burn-down of {jobs:,} jobs, {workers} workers, PostgreSQL on loopback (medians of one run's rounds)")
    for index, rate in enumerate(rates):
        axis.text(index, rate, f"{rate:,.0f}", ha="center", va="bottom", fontsize=8)
    axis.tick_params(axis="x", labelsize=8)

    concurrencies = sorted({c for _, by in worker_rows for c in by})
    width = 0.8 / len(worker_rows)
    palette = ["#2b6cb0", "#63b3ed", "#ed8936", "#c05621", "#68d391", "#2f855a"]
    for index, (name, by_concurrency) in enumerate(worker_rows):
        xs = [position + (index - (len(worker_rows) - 1) / 2) * width
              for position, c in enumerate(concurrencies) if c in by_concurrency]
        ys = [by_concurrency[c] for c in concurrencies if c in by_concurrency]
        worker_axis.bar(xs, ys, width, label=name, color=palette[index % len(palette)])
        for x, y in zip(xs, ys):
            worker_axis.text(x, y, f"{y:,.0f}", ha="center", va="bottom", fontsize=7)
    worker_axis.set_xticks(range(len(concurrencies)), [f"concurrency {c}" for c in concurrencies])
    worker_axis.set_ylabel("jobs per second")
    worker_axis.set_title("Workers: each system's own worker loop draining the same waiting no-op jobs")
    worker_axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    arguments = [a for a in sys.argv[1:] if a != "--smoke"]
    main(*arguments, smoke="--smoke" in sys.argv)
