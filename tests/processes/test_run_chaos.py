"""Chaos for Runs across three nodes (issue 27): node processes run a mix of one-hop and
two-hop Runs (the second hop resumes from a consent this test grants, or from a durable
timer the relays fire when due) on tenure's owned
queue in a PostgreSQL server of the test's own, while the test kills a node with
``kill -9`` and restarts it under the same name, kills another for good and starts a
replacement under a new name (the dead node must be taken over through its node lease),
freezes a third with SIGSTOP past its node lease until another node took it over, then
thaws it (it must fence itself and boot again; its stale writes are refused), and
restarts the server. Runs are admitted in batches between the faults, so every fault
lands on hops in flight; a freeze that fenced none of its node's hops is repeated (with
a few more Runs admitted first), so the run always tests a stale write.

At the end (a bounded wait, never a timing) every Run is terminal; each hop sequence of
a Run was started at most once; the hops whose fenced write was accepted (``end`` in
the side-effect log, see tests/support/run_chaos_node.py) never held one Run at overlapping
instants, on the processes' monotonic clock, and in the step journal, on the
database's clock, a Run's accepted writes follow its sequences in order and none came
after the Run ended; every DONE Run kept the result of an accepted hop of its own
workflow; no Run whose workflow declared ``on_lost="retry"`` failed ``lost``; no Run
failed ``lost`` after its hop recorded its outcome. The ``lost`` Runs are counted per
declared policy and printed with the other figures (``-s`` shows them). A share of the
Runs are replayed workflows (``story``, issue 50): their waits (a consent, a message sent
before the Run asks or while it waits, a timer, a child Run) return answers by replay, and
each DONE one shows its journal's calls once and in order, a step answer recorded once
whatever re-ran its body, its one message received, and its child DONE.

``TENURE_CHAOS_RUNS`` sets the number of Runs (default 60; the soak is 300, with one
round of the four faults per 60 Runs); ``TENURE_CHAOS_SEED`` the seed (printed).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest

from adapter_support import pg_ctl, private_pg_server, raw
from node_support import NodeProcess, start_node
from run_chaos_node import FLOWS, registry
from tenure.adapters import QueueBroker, RunLedger, resume_and_publish, upgrade
from tenure.adapters.runs.ledger import run_id_for
from tenure.kernel.nodes.record import NodeStatus
from tenure.model import ConsentStatus, RunIntent, RunRecord, RunStatus, TenureError, WaitKind

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("TENURE_CHAOS_RUNS", "60"))
SEED = int(os.environ.get("TENURE_CHAOS_SEED", "20270127"))
NODE_LEASE_S = 2.0
RELAY_INTERVAL_S = 0.25
RUNS_PER_ROUND = 60
"""One round of the four faults per this many Runs."""
FAIL_SHARE = 0.2
"""The share of Runs whose workflow keeps the default ``on_lost="fail"``."""
SETTLE_DEADLINE_S = max(240.0, 2.0 * RUNS)
"""Hang guard: how long the Runs may take to settle once the faults stopped."""
FAULT_GUARD_S = 60.0
"""Hang guard for each wait inside a fault (a node busy, a takeover, a restart)."""
FAULTS_GUARD_S = 240.0 + 180.0 * math.ceil(RUNS / RUNS_PER_ROUND)
"""Hang guard for the whole phase of admissions and faults."""
FREEZE_ATTEMPTS = 6
"""Tries to freeze a node inside a hop and outside a writing transaction (then it freezes
outside a writing transaction, in a hop or not)."""
LOCK_FREE_TRIES = 20
"""Further tries, after the attempts to freeze a node inside a hop, to freeze it at least
outside a transaction holding row locks (a thawed node ends its transaction at once)."""
FREEZE_ROUNDS = 4
"""A freeze that fenced none of its frozen hops (it landed between hops, or every hop
wrote before its Run moved) tested nothing: it is repeated, with fresh Runs admitted
first, up to this many times per round of faults (on a loaded machine the nodes may all
wait on consents and timers when the freeze comes)."""

TERMINAL = (RunStatus.DONE, RunStatus.FAILED, RunStatus.CANCELLED)
FAULTS = ("kill_and_restart", "kill_and_replace", "freeze_past_lease", "restart_server")


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float, what: str, *, required: bool = True) -> Any:
    """A hang guard, not a timing: poll ``check`` until it answers; database failures (the
    server restarting) count as not yet."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        with contextlib.suppress(TenureError):
            value = await check()
            if value:
                return value
        if asyncio.get_running_loop().time() > deadline:
            if required:
                raise AssertionError(f"{what}: not met in {timeout_s:.0f} s (seed {SEED})")
            return None
        await asyncio.sleep(0.1)


async def durably(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    """The test's own writes, retried through the server restart (bounded)."""
    deadline = time.monotonic() + FAULT_GUARD_S
    while True:
        try:
            return await call()
        except TenureError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{what}: the database never answered (seed {SEED})") from None
            await asyncio.sleep(0.2)


# --- the side-effect log ---------------------------------------------------------------------


def read_effects(folder: pathlib.Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(folder.glob("*.log")):
        for line in path.read_text(encoding="utf-8").splitlines():
            with contextlib.suppress(json.JSONDecodeError):  # a line cut short by kill -9
                events.append(json.loads(line))
    return events


def in_flight(events: list[dict[str, Any]], pid: int) -> set[tuple[str, int]]:
    """The hops process ``pid`` started and has not ended, had refused or cancelled."""
    started = {(e["run"], e["seq"]) for e in events if e["pid"] == pid and e["e"] == "start"}
    over = {(e["run"], e["seq"]) for e in events if e["pid"] == pid and e["e"] in ("end", "refused", "cancelled")}
    return started - over


# --- the nodes -------------------------------------------------------------------------------


@dataclasses.dataclass
class Freeze:
    node: str
    pid: int
    epoch: int
    """The node's epoch when it was frozen: it must boot again after the thaw."""
    thawed_at_ns: int
    moved: dict[tuple[str, int], bool]
    """The hops in flight at the freeze, and whether their Run moved on while frozen."""
    fenced: int
    """How many of those hops the thawed node had refused or cancelled."""


class Cluster:
    """Three node slots; the faults; what they did."""

    def __init__(self, db_url: str, ledger: RunLedger, server: dict[str, str], folder: pathlib.Path) -> None:
        self.db_url, self.ledger, self.server, self.folder = db_url, ledger, server, folder
        self.effects = folder / "effects"
        self.effects.mkdir()
        self.slots: list[NodeProcess] = []
        self.everyone: list[NodeProcess] = []
        self._names = iter(f"node-{chr(ord('a') + index)}" for index in range(26 * 26))
        self.abandoned: list[str] = []
        self.freezes: list[Freeze] = []
        self.done: collections.Counter[str] = collections.Counter()

    async def start(self, name: str) -> NodeProcess:
        node = await start_node("run_chaos_node.py", self.db_url, node=name, lease_s=NODE_LEASE_S, log_dir=self.folder,
                                env={"TENURE_CHAOS_LOG_DIR": str(self.effects), "TENURE_CHAOS_DB": self.db_url,
                                     "TENURE_CHAOS_RELAY_S": str(RELAY_INTERVAL_S)})
        self.everyone.append(node)
        return node

    async def boot(self, count: int) -> None:
        for _ in range(count):
            self.slots.append(await self.start(next(self._names)))

    async def kill_everyone(self) -> None:
        for node in self.everyone:
            await node.kill()

    async def busy(self, slot: int, timeout_s: float = FAULT_GUARD_S) -> None:
        """Wait (a while at most) until the node in ``slot`` is inside a hop body: a fault
        then lands mid-hop."""
        pid = self.slots[slot].pid

        async def busy() -> bool:
            return bool(in_flight(read_effects(self.effects), pid))

        await until(busy, timeout_s, "", required=False)

    async def run(self, fault: str) -> bool:
        """Apply ``fault``; whether it tested something (a freeze: it fenced a hop)."""
        slot = {"kill_and_restart": 0, "kill_and_replace": 1, "freeze_past_lease": 2, "restart_server": 0}[fault]
        if fault != "freeze_past_lease":  # the freeze looks for itself: exactly, once frozen
            await self.busy(slot)
        await getattr(self, fault)(slot)
        self.done[fault] += 1
        return fault != "freeze_past_lease" or self.freezes[-1].fenced > 0

    async def kill_and_restart(self, slot: int) -> None:
        """kill -9, then a new process under the same node name (its boot reconciles the
        dead incarnation's hops, unless another node took them over first)."""
        node = self.slots[slot]
        await node.kill()
        self.slots[slot] = await self.start(node.node)

    async def kill_and_replace(self, slot: int) -> None:
        """kill -9 for good: a live node must take the dead one over through its lease."""
        node = self.slots[slot]
        await node.kill()
        self.abandoned.append(node.node)
        self.slots[slot] = await self.start(next(self._names))

    async def freeze_past_lease(self, slot: int) -> None:
        """SIGSTOP until another node took this one over (and moved its hops' Runs on, or
        a while passed), then SIGCONT."""
        node = self.slots[slot]
        held: list[str] = []
        for attempt in range(FREEZE_ATTEMPTS + LOCK_FREE_TRIES):
            if attempt < FREEZE_ATTEMPTS:
                await self.busy(slot, FAULT_GUARD_S / FREEZE_ATTEMPTS)
            row = await durably(lambda: self.ledger.nodes.get(node.node), "read the node")
            assert row is not None
            node.freeze()
            # Frozen inside a hop when it can be (exact: a frozen process writes nothing),
            # and never inside a transaction holding row locks: they would hold the takeover
            # back until the thaw (the last tries give up only the hop).
            hops = in_flight(read_effects(self.effects), node.pid)
            if hops or attempt >= FREEZE_ATTEMPTS - 1:
                held = await self.row_locks_left_held()
                if not held:
                    break
            node.thaw()
        else:
            raise AssertionError(f"{node.node} never stood without row locks held to be frozen (seed {SEED}); "
                                 f"the last statements of the sessions holding them: {held}")
        try:

            async def taken_over() -> bool:
                found = await self.ledger.nodes.get(node.node)
                return found is not None and (found.status is not NodeStatus.LIVE or found.epoch != row.epoch)

            await until(taken_over, FAULT_GUARD_S, f"frozen {node.node} was not taken over")
            moved: dict[tuple[str, int], bool] = {}

            async def all_moved() -> bool:
                for run_id, seq in hops:
                    run = await self.ledger.get(run_id)
                    moved[(run_id, seq)] = run is not None and (run.enqueue_seq != seq or run.status in TERMINAL)
                return all(moved.values())

            # The takeover may wait on a row lock the frozen process holds: then its Runs
            # move only after the thaw, and the freeze still tested the lease.
            await until(all_moved, 15.0, "", required=False)
        finally:
            thawed_at_ns = time.monotonic_ns()  # nothing the node writes later was sent before it
            node.thaw()

        async def hops_over() -> list[dict[str, Any]]:  # the thawed node ends every frozen hop
            events = read_effects(self.effects)
            return [] if in_flight(events, node.pid) & set(hops) else events or [{}]

        events = await until(hops_over, FAULT_GUARD_S, f"thawed {node.node} never ended its frozen hops")
        fenced = sum(1 for e in events if e.get("pid") == node.pid and e.get("e") in ("refused", "cancelled")
                     and (e["run"], e["seq"]) in hops)
        self.freezes.append(Freeze(node.node, node.pid, row.epoch, thawed_at_ns, moved, fenced))

    async def row_locks_left_held(self) -> list[str]:
        """The last statement of each session that sits idle in the same writing
        transaction (it has a transaction ID: it wrote or locked rows) for a third of a
        second: only a frozen process does (none: the freeze may stand)."""
        sql = ("SELECT pid, xact_start, query FROM pg_stat_activity WHERE datname = current_database() "
               "AND state LIKE 'idle in transaction%' AND backend_xid IS NOT NULL")
        first = set(await asyncio.to_thread(raw, self.db_url, sql))
        await asyncio.sleep(0.3)
        return sorted(query[:200] for query in {row[2] for row in first & set(await asyncio.to_thread(raw, self.db_url, sql))})

    async def restart_server(self, slot: int) -> None:
        await asyncio.to_thread(pg_ctl, self.server, "restart")


# --- the test process's side: admissions and consents -----------------------------------------


@dataclasses.dataclass(frozen=True)
class Planned:
    n: int
    flow: str

    @property
    def policy(self) -> str:
        return FLOWS[self.flow]


def plan(rng: random.Random) -> list[Planned]:
    fails = max(3, round(RUNS * FAIL_SHARE))
    chosen = (["one-fail", "two-fail", "nap-fail"] * fails)[:fails] + (["one", "two", "nap", "story"] * RUNS)[:RUNS - fails]
    rng.shuffle(chosen)
    return [Planned(n, flow) for n, flow in enumerate(chosen)]


def more_work(admitted: dict[str, Planned], count: int = 3) -> list[Planned]:
    """Fresh one-hop Runs beyond the plan (numbered after it), for a repeated freeze."""
    first = max(RUNS, max((planned.n + 1 for planned in admitted.values()), default=0))
    return [Planned(n, "one") for n in range(first, first + count)]


async def admit(ledger: RunLedger, publisher: QueueBroker, batch: list[Planned], admitted: dict[str, Planned]) -> None:
    for planned in batch:
        intent = RunIntent(None, "chaos", "alice", frozenset(), {"n": planned.n})
        admission = await durably(lambda: ledger.admit(intent, workflow=registry.pin(planned.flow, "1"), queue="runs",
                                                       priority=50, idempotency_key=f"chaos-{SEED}-{planned.n}"),
                                  "admit a Run")
        admitted[admission.run.run_id] = planned
        with contextlib.suppress(TenureError):  # a publish that fails is the relays' to repeat
            await ledger.publish(admission.run.run_id, 0, publisher)
        if planned.flow == "story" and planned.n % 2 == 0:  # a message sent before the Run asks for it
            await durably(lambda: send_go(ledger, admission.run.run_id, planned.n, publisher), "send a message")


async def send_go(ledger: RunLedger, run_id: str, n: int, publisher: QueueBroker) -> None:
    """The one message a ``story`` Run receives (replay-safe by its message ID)."""
    await ledger.messages.send(run_id, "go", {"go": n}, message_id=f"go-{run_id}", broker=publisher)


async def grant_consents(ledger: RunLedger, publisher: QueueBroker, stop: asyncio.Event,
                         granted: collections.Counter[str]) -> None:
    """Grant every consent a Run waits on; resume every other Run here (the relays resume
    the rest, and race this one for some)."""
    while not stop.is_set():
        with contextlib.suppress(TenureError):
            page = await ledger.list_runs(status=RunStatus.AWAITING_CONSENT, limit=1000)
            for run in page.items:
                if run.owner_kind is not WaitKind.CONSENT or run.owner_id is None:
                    continue
                if await ledger.consents.decide(run.owner_id, ConsentStatus.GRANTED, decided_by="chaos"):
                    granted["granted"] += 1
                if int(run.run_id[-1], 16) % 2 and await resume_and_publish(ledger, publisher, run.run_id,
                                                                           owner_id=run.owner_id) is not None:
                    granted["resumed_here"] += 1
            waiting = await ledger.list_runs(status=RunStatus.AWAITING_MESSAGE, limit=1000)
            for run in waiting.items:  # a story waits for its message: send it (again is a replay)
                await send_go(ledger, run.run_id, run.payload["n"], publisher)
                granted["messages"] += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def every_run(ledger: RunLedger) -> dict[str, RunRecord]:
    """Every Run of the database (the test's own server holds only this test's)."""
    found: dict[str, RunRecord] = {}
    after = None
    while True:
        page = await ledger.list_runs(after=after, limit=500)
        found.update((run.run_id, run) for run in page.items)
        if page.next_cursor is None:
            return found
        after = page.next_cursor


# --- the checks ------------------------------------------------------------------------------


def step_rows(db_url: str) -> dict[str, list[tuple[int, Any, dict[str, Any]]]]:
    """Each Run's accepted hop writes: (sequence, database instant, recorded value); the
    replay journal's entries (``@<position>``) are :func:`journals`'."""
    rows: dict[str, list[tuple[int, Any, dict[str, Any]]]] = collections.defaultdict(list)
    for run_id, seq, recorded_at, value in raw(
            db_url, "SELECT run_id, enqueue_seq, recorded_at, result_json FROM tenure_run_steps WHERE name LIKE 'hop-%'"):
        rows[run_id].append((seq, recorded_at, json.loads(value)))
    return rows


def check_hops(runs: dict[str, RunRecord], events: list[dict[str, Any]], steps: dict[str, list[Any]]) -> None:
    starts = collections.Counter((e["run"], e["seq"]) for e in events if e["e"] == "start")
    twice = [hop for hop, count in starts.items() if count > 1]
    assert not twice, f"hops started more than once (a sequence claimed twice): {twice[:5]} (seed {SEED})"
    accepted: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        if event["e"] == "end":
            accepted[event["run"]].append(event)
    for run_id, ends in accepted.items():
        ends.sort(key=lambda e: e["start"])
        for earlier, later in zip(ends, ends[1:]):
            assert earlier["prewrite"] < later["start"], (
                f"run {run_id}: hops {earlier['seq']} (pid {earlier['pid']}) and {later['seq']} (pid {later['pid']}) "
                f"held it at once (seed {SEED})")
        recorded = {seq: value for seq, _, value in steps.get(run_id, [])}
        for end in ends:  # the end marker follows the write the ledger accepted for that very hop
            assert recorded.get(end["seq"], {}).get("pid") == end["pid"], (run_id, end, recorded)
    for run_id, rows in steps.items():
        ordered = sorted(rows, key=lambda row: row[1])
        assert [row[0] for row in ordered] == sorted(row[0] for row in rows), (
            f"run {run_id}: accepted writes out of sequence order on the database clock (seed {SEED})")
        ended = runs[run_id].updated_at
        assert all(row[1] <= ended for row in rows), f"run {run_id}: a write accepted after it ended (seed {SEED})"


def journals(db_url: str) -> dict[str, dict[int, dict[str, Any]]]:
    """Each replayed Run's journal: position -> the recorded call and answer."""
    found: dict[str, dict[int, dict[str, Any]]] = collections.defaultdict(dict)
    for run_id, name, value in raw(db_url, "SELECT run_id, name, result_json FROM tenure_run_steps "
                                           "WHERE name LIKE '@%'"):
        found[run_id][int(name[1:])] = json.loads(value)
    return found


STORY_CALLS = ["step:stamp", "consent:mail.send", "recv:go", "sleep", "child:leaf", "child_result:leaf"]
"""The calls a ``story`` Run's journal holds, in order, once it ended DONE."""


def check_stories(runs: dict[str, RunRecord], children: dict[str, RunRecord], admitted: dict[str, Planned],
                  events: list[dict[str, Any]], journal: dict[str, dict[int, dict[str, Any]]]) -> int:
    """Every DONE ``story`` got its answers by replay: its journal holds each call once, in
    order; its step's body ran (at least once) and the answer it returns is the one recorded
    (never a second body's); its consent was granted; its one child Run (started once,
    however many hops replayed the parent) ended DONE with the result the parent returns.
    Every child belongs to a story. How many stories ended DONE."""
    stepped = collections.Counter(e["run"] for e in events if e["e"] == "step")
    parents: dict[str, str] = {}
    done = 0
    for run_id, run in runs.items():
        if admitted[run_id].flow != "story" or run.status is not RunStatus.DONE:
            continue
        done += 1
        result, entries = run.result or {}, journal.get(run_id, {})
        assert [entries[p]["call"] for p in sorted(entries)] == STORY_CALLS, (run_id, entries, SEED)
        assert stepped[run_id] >= 1 and result["stamp"] == entries[0]["answer"], (run_id, result, entries[0])
        assert result["verdict"] == "granted" == entries[1]["answer"]["status"], (run_id, result)
        assert result["note"] == {"go": admitted[run_id].n} == entries[2]["answer"]["message"], (run_id, result)
        child = children.get(result["child"])
        assert child is not None and child.status is RunStatus.DONE and child.result == result["leaf"], (
            f"story {run_id}: child {result['child']} {child} (seed {SEED})")
        assert (result["leaf"]["flow"], result["leaf"]["n"]) == ("leaf", admitted[run_id].n)
        parents[result["child"]] = run_id
    for child_id, child in children.items():
        assert child.workflow.name == "leaf", f"a Run nobody admitted: {child_id} {child.workflow} (seed {SEED})"
        assert child.status in TERMINAL, (child_id, child.status)
    return done


def check_results(runs: dict[str, RunRecord], admitted: dict[str, Planned], events: list[dict[str, Any]],
                  consents: dict[str, Any]) -> None:
    ends = {(e["run"], e["seq"], e["pid"]) for e in events if e["e"] == "end"}
    recorded = {(e["run"], e["seq"]) for e in events if e["e"] == "outcome" and e["recorded"]}
    for run_id, run in runs.items():
        planned = admitted[run_id]
        if run.status is RunStatus.DONE:
            result = run.result
            assert result is not None and (result["flow"], result["n"]) == (planned.flow, planned.n), (run_id, result)
            assert (run_id, result["seq"], result["pid"]) in ends, f"run {run_id}: DONE by a hop with no accepted write"
            if planned.flow.startswith("nap"):  # resumed by its own timer, not by a hop that never slept
                assert str(result.get("timer", "")).startswith("sleep:"), (run_id, result)
            if planned.flow.startswith("two"):
                consent = consents[run_id]
                assert consent is not None and consent.run_id == run_id and consent.status is ConsentStatus.GRANTED
        else:
            assert run.status is RunStatus.FAILED and run.error == "lost", (
                f"run {run_id} ({planned.flow}) ended {run.status.value} {run.error} (seed {SEED})")
            assert (run_id, run.enqueue_seq) not in recorded, (
                f"run {run_id} failed lost after its hop {run.enqueue_seq} recorded its outcome (seed {SEED})")


def check_freezes(cluster: Cluster, events: list[dict[str, Any]], epochs: dict[str, tuple[NodeStatus, int]]) -> None:
    for freeze in cluster.freezes:
        status, epoch = epochs[freeze.node]
        assert status is NodeStatus.LIVE and epoch > freeze.epoch, f"{freeze.node} did not boot again after its thaw"
        stale = [e for e in events if e["pid"] == freeze.pid and e["e"] == "end"
                 and freeze.moved.get((e["run"], e["seq"])) and e["prewrite"] > freeze.thawed_at_ns]
        assert not stale, f"writes of {freeze.node}'s frozen hops accepted after the thaw: {stale[:3]} (seed {SEED})"


# --- the scenario ----------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    cluster: Cluster
    admitted: dict[str, Planned]
    runs: dict[str, RunRecord]
    """The Runs the test admitted."""
    children: dict[str, RunRecord]
    """The child Runs the ``story`` Runs started."""
    consents: dict[str, Any]
    """The consent each DONE two-hop Run's result names."""
    epochs: dict[str, tuple[NodeStatus, int]]
    granted: collections.Counter[str]


async def run_chaos(db_url: str, server: dict[str, str], folder: pathlib.Path) -> Outcome:
    """Boot the nodes, admit the Runs in batches with a fault after each, and wait (bounded)
    until every Run ended; then read what the checks need."""
    planned = plan(random.Random(SEED))
    faults = list(FAULTS) * math.ceil(RUNS / RUNS_PER_ROUND)
    size = math.ceil(len(planned) / (len(faults) + 1))
    batches = [planned[index:index + size] for index in range(0, len(planned), size)]
    admitted: dict[str, Planned] = {}
    granted: collections.Counter[str] = collections.Counter()
    stop = asyncio.Event()
    async with RunLedger(db_url, timeout_seconds=10) as ledger:
        publisher = QueueBroker(db_url, queues=["runs"])
        cluster = Cluster(db_url, ledger, server, folder)
        granter = asyncio.ensure_future(grant_consents(ledger, publisher, stop, granted))
        try:
            async with asyncio.timeout(FAULTS_GUARD_S):
                await cluster.boot(3)
                for index, batch in enumerate(batches):
                    await admit(ledger, publisher, batch, admitted)
                    if index < len(faults):
                        for again in range(FREEZE_ROUNDS):
                            if again:
                                await admit(ledger, publisher, more_work(admitted), admitted)
                            if await cluster.run(faults[index]):
                                break
            await settle(ledger, cluster, len(admitted))
            everything = await durably(lambda: every_run(ledger), "read the Runs")
            assert set(admitted) <= set(everything)
            runs = {run_id: everything[run_id] for run_id in admitted}
            children = {run_id: run for run_id, run in everything.items() if run_id not in admitted}
            consents = {run_id: await ledger.consents.get(run.result["consent"]) for run_id, run in runs.items()
                        if run.status is RunStatus.DONE and "consent" in (run.result or {})}
            epochs = {}
            for node in cluster.everyone:
                row = await ledger.nodes.get(node.node)
                assert row is not None
                epochs[node.node] = (row.status, row.epoch)
        finally:
            stop.set()
            await asyncio.wait({granter}, timeout=30)
            await cluster.kill_everyone()
            await asyncio.wait_for(publisher.close(), 30)
    return Outcome(cluster, admitted, runs, children, consents, epochs, granted)


async def settle(ledger: RunLedger, cluster: Cluster, count: int) -> None:
    """Wait until every Run ended and every node killed for good was taken over; a Run that
    did not end by the deadline is stranded (reported with the nodes and their logs)."""
    async def settled() -> bool:
        runs = await every_run(ledger)  # the admitted Runs and the children the stories started
        return len(runs) >= count and all(run.status in TERMINAL for run in runs.values())

    if not await until(settled, SETTLE_DEADLINE_S, "", required=False):
        stranded = [(run.run_id, run.workflow.name, run.status.value, run.node, run.enqueue_seq)
                    for run in (await every_run(ledger)).values() if run.status not in TERMINAL]
        # Each stranded Run's delivery and what the queue says of its hop (why nothing moved it).
        probe = QueueBroker(cluster.db_url, queues=["runs"])
        try:
            hops = {}
            for run_id, _, _, _, seq in stranded[:10]:
                delivery = await ledger.get_delivery(run_id, seq)
                hops[run_id[:8]] = (delivery, (await probe.probe(f"run:{run_id}:{seq}")).state.value)
        finally:
            await probe.close()
        # Each stranded Run's delegated jobs and, for a child Run's job, that child (by the
        # ID recorded on the job, or the one its admission key names): what containment met.
        effects: dict[str, list[Any]] = {}
        for run_id, *_ in stranded[:5]:
            for job in await ledger.jobs.list(run_id):
                key = job.request.get("key") if isinstance(job.request, dict) else None
                child_id = job.runtime_job_id or (run_id_for(key) if isinstance(key, str) and key else None)
                child = None if child_id is None else await ledger.get(child_id)
                effects.setdefault(run_id[:8], []).append((
                    job.status.value, job.runtime, job.runtime_job_id, child_id,
                    None if child is None else (child.status.value, child.enqueue_seq, child.node, child.error)))
        nodes = {node.node: await ledger.nodes.get(node.node) for node in cluster.everyone}
        warnings = {f"{node.node} (pid {node.pid})": node.stderr().splitlines()[-12:] for node in cluster.everyone}
        reports = await ledger.recovery_reports.latest()
        raise AssertionError(f"{len(stranded)} Runs stranded after {SETTLE_DEADLINE_S:.0f} s (seed {SEED}): "
                             f"{stranded[:10]}; (delivery, hop) {hops}; effects (job status, runtime, recorded child, "
                             f"child, child Run) {effects}; nodes {nodes}; node logs {warnings}; reports {reports}; "
                             f"side-effect logs in {cluster.effects}")

    async def taken_over() -> bool:
        rows = [await ledger.nodes.get(name) for name in cluster.abandoned]
        return all(row is not None and row.status is NodeStatus.TAKEN_OVER for row in rows)

    await until(taken_over, FAULT_GUARD_S, "a node killed for good was not taken over")


def summarise(outcome: Outcome, events: list[dict[str, Any]], seconds: float) -> tuple[str, collections.Counter[str]]:
    """The figures, and the lost Runs by declared policy."""
    runs, admitted = outcome.runs, outcome.admitted
    lost = collections.Counter(admitted[run_id].policy for run_id, run in runs.items() if run.error == "lost")
    policies = collections.Counter(planned.policy for planned in admitted.values())
    fenced = collections.Counter(e["e"] for e in events if e["e"] in ("refused", "cancelled"))
    ended = {(e["run"], e["seq"]) for e in events if e["e"] == "end"}
    # Legitimate: the process died (or froze and was taken over) after the hop's write and
    # before its outcome was recorded (an outcome recorded, then failed lost, fails the test).
    after_write = sum(1 for run_id, run in runs.items() if run.error == "lost" and (run_id, run.enqueue_seq) in ended)
    retries = [run.hop_retries for run in runs.values()]
    summary = (
        f"seed {SEED}: {len(runs)} Runs ({dict(collections.Counter(p.flow for p in admitted.values()))}); "
        f"faults {dict(outcome.cluster.done)}; lost: retry {lost['retry']} of {policies['retry']}, "
        f"fail {lost['fail']} of {policies['fail']} ({after_write} after their hop's write); "
        f"done {sum(run.status is RunStatus.DONE for run in runs.values())}; hops accepted {len(ended)}, "
        f"stale hops fenced {dict(fenced)}; hop retries {sum(retries)} (max {max(retries)}); "
        f"consents granted {outcome.granted['granted']} (resumed here {outcome.granted['resumed_here']}); "
        f"node epochs {({name: epoch for name, (_, epoch) in outcome.epochs.items()})}; {seconds:.0f} s")
    return summary, lost + collections.Counter({"fenced": sum(fenced.values())})


@pytest.fixture
def server() -> Iterator[dict[str, str]]:
    with private_pg_server() as made:
        yield made


async def test_runs_on_three_nodes_end_and_never_run_twice_at_once_through_kills_a_freeze_and_a_server_restart(
    server: dict[str, str], tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str],
) -> None:
    db_url = server["TEST_PG_DSN"]
    await upgrade(db_url)
    began = time.monotonic()
    outcome = await run_chaos(db_url, server, tmp_path)
    events = read_effects(outcome.cluster.effects)
    check_hops({**outcome.runs, **outcome.children}, events, step_rows(db_url))
    check_results(outcome.runs, outcome.admitted, events, outcome.consents)
    stories = check_stories(outcome.runs, outcome.children, outcome.admitted, events, journals(db_url))
    check_freezes(outcome.cluster, events, outcome.epochs)
    summary, counts = summarise(outcome, events, time.monotonic() - began)
    with capsys.disabled():
        print(f"\nrun chaos: {summary}; stories done {stories} (children {len(outcome.children)})")
    assert counts["retry"] == 0, f"Runs of workflows declared on_lost=retry failed lost: {summary}"
    assert counts["fenced"] >= 1, f"no stale hop was fenced: the faults tested nothing ({summary})"
    assert stories >= 1, f"no replayed story ended DONE: the replay was not tested ({summary})"
