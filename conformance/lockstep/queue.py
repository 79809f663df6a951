"""The owned queue's lockstep: the kernel-backed model and a real database.

One Hypothesis ``RuleBasedStateMachine`` drives the same operations through the public
job sources of a real store and through the model in :mod:`.queue_model`; after every
step the replies must agree and every persisted row must equal the model's record. The
machine takes a store factory, so every database runs the same suite. The database
time each transaction sampled is observed and handed to the model, so the model
decides with exactly the clock the database used.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, invariant, multiple, rule

from tenure.adapters import JobSource, PipelineJobSource, StreamingJobSource, TaskSource, ValidationJobSource
from tenure.adapters.queue.table import binding_for
from tenure.conformance.lockstep import raw
from tenure.conformance.lockstep.harness import LockstepBase
from tenure.conformance.lockstep.queue_model import Model
from tenure.kernel.queue import finders
from tenure.model import (
    PYCHARTER_QUEUES,
    PipelineJob,
    QueueClaimFence,
    QueueKind,
    StreamingJob,
    TaskJob,
    ValidationJob,
    WorkerConfig,
    canonical_json,
    freeze_envelope,
    snapshot_submission,
)

__all__ = ["LockstepMachine", "Model", "envelope"]

SOURCES: dict[QueueKind, type[JobSource[Any]]] = {
    QueueKind.VALIDATION: ValidationJobSource,
    QueueKind.PIPELINE: PipelineJobSource,
    QueueKind.STREAMING: StreamingJobSource,
    QueueKind.TASK: TaskSource,
}
OWNERS = ["worker-a", "worker-b", "Worker-A"]
TOKENS = [f"token-{n}" for n in range(10)]
SUBMISSIONS = [f"sub-{n}" for n in range(6)]
LEASE_SHIFT_US = 7_200_000_000
TASK_QUEUES = ("emails", "reports")
SERVED = st.sampled_from([("emails",), ("reports",), ("emails", "reports")])
"""The task queues a task claim serves."""
CONTENTION_STEPS_PER_RUN = 2
"""Lock-contention steps per run: each waits tens of milliseconds for a real lock."""


def envelope(queue: QueueKind, variant: int, authored_id: str | None, key: str | None, force: bool) -> Any:
    """A small family of requests: equal arguments give equal content."""
    if queue is QueueKind.VALIDATION:
        return ValidationJob("orders", "1", f"source-{variant}", options={"v": variant}, job_id=authored_id,
                             idempotency_key=key, max_attempts=2 + variant % 2)
    if queue is QueueKind.PIPELINE:
        return PipelineJob({"steps": [variant]}, {"v": str(variant)}, job_id=authored_id, idempotency_key=key,
                           run_id=None if authored_id is None else f"run-{authored_id}", max_attempts=2)
    if queue is QueueKind.TASK:
        # Priorities differ by variant so that claims meet every order; no retry delay,
        # as for the other queues (the config's backoff is 0).
        return TaskJob(TASK_QUEUES[variant % 2], "send", {"v": variant}, priority=(0, 50, 100)[variant],
                       retry_base_ms=0, retry_max_ms=0, retry_jitter=False, job_id=authored_id, max_attempts=2,
                       delay_ms=(None, 0, 1)[variant])
    return StreamingJob("orders", str(variant % 2), {"v": str(variant)}, force=force, job_id=authored_id, max_attempts=2)


class LockstepMachine(LockstepBase):
    """The owned queue's lockstep; subclassed per database (see ``machine_for``)."""

    machine_name = "queue"
    fences = Bundle("fences")

    def __init__(self) -> None:
        super().__init__()
        self.config = WorkerConfig(self.db_url, lease_seconds=60, heartbeat_seconds=20, backoff_base_ms=0, backoff_max_ms=0)
        self.model = Model(self.config)
        self.contention_steps = 0
        self.ids = itertools.count(1)
        self.next_job_id = ""
        self.next_run_id = ""
        self.sources: dict[QueueKind, Any] = {}
        for queue, source_type in SOURCES.items():
            # The ID factories are the sources' constructor arguments (the adapters' test
            # seam): the database stores the IDs the model chose.
            source = source_type(self.db_url, self.config, new_job_id=lambda: self.next_job_id,
                                 new_run_id=lambda: self.next_run_id)
            source.operations.store.observe_time = self.clock.seen.append
            self.sources[queue] = source

    def close_resources(self) -> None:
        for source in self.sources.values():
            self.runner.run(source.close())

    # --- helpers ------------------------------------------------------------------------

    def fresh_ids(self) -> None:
        n = next(self.ids)
        self.next_job_id = f"job-{n:05d}"
        self.next_run_id = f"run{n:05d}"

    def claimed_view(self, record: Any) -> Any:
        return None if record is None else self.sources[record.queue].claimed_view(record)

    def known_ids(self, queue: QueueKind) -> list[str]:
        return sorted(self.model.rows[queue]) + ["job-missing"]

    # --- submissions ----------------------------------------------------------------------

    @rule(
        queue=st.sampled_from(QueueKind), submission=st.sampled_from(SUBMISSIONS), variant=st.integers(0, 2),
        authored_id=st.none() | st.sampled_from(["a-1", "a-2"]), key=st.none() | st.sampled_from(["k-1", "k-2"]),
        force=st.booleans(),
    )
    def submit_owned(self, queue: QueueKind, submission: str, variant: int, authored_id: str | None, key: str | None, force: bool) -> None:
        request = envelope(queue, variant, authored_id, key, force)
        self.fresh_ids()
        actual = self.run(self.sources[queue].submit_owned(request, submission_id=submission))
        snap = snapshot_submission(queue, request, submission)
        expected = self.model.submit_owned(snap, self.next_job_id, self.next_run_id, self.clock.take())
        self.expect(actual, expected)

    @rule(
        queue=st.sampled_from(QueueKind), variant=st.integers(0, 2),
        authored_id=st.none() | st.sampled_from(["a-1", "a-3"]), key=st.none() | st.sampled_from(["k-1", "k-3"]),
        force=st.booleans(),
    )
    def submit_legacy(self, queue: QueueKind, variant: int, authored_id: str | None, key: str | None, force: bool) -> None:
        request = envelope(queue, variant, authored_id, key, force)
        self.fresh_ids()
        actual = self.run(self.sources[queue].submit(request))
        frozen = freeze_envelope(queue, request)
        expected = self.model.submit_legacy(frozen, self.next_job_id, self.next_run_id, self.clock.take())
        self.expect(actual, expected)

    # --- claims ---------------------------------------------------------------------------

    def served(self, queue: QueueKind, served: tuple[str, ...]) -> dict[str, Any]:
        """A task claim's queues, as the source takes them (the other queues' claims name none)."""
        return {"queues": list(served)} if queue is QueueKind.TASK else {}

    @rule(target=fences, queue=st.sampled_from(QueueKind), owner=st.sampled_from(OWNERS), token=st.sampled_from(TOKENS),
          served=SERVED)
    def claim_owned(self, queue: QueueKind, owner: str, token: str, served: tuple[str, ...]) -> Any:
        actual = self.run(self.sources[queue].claim_next_owned(owner, claim_token=token, **self.served(queue, served)))
        expected = self.model.claim_owned(queue, owner, [token], self.clock.take(),
                                          served if queue is QueueKind.TASK else None)
        if expected[0] == "ok":
            expected = ("ok", self.claimed_view(expected[1][0]) if expected[1] else None)
        self.expect(actual, expected)
        return actual[1].claim_fence if actual[0] == "ok" and actual[1] is not None else QueueClaimFence(
            queue, "job-missing", owner, 1, token
        )

    @rule(
        target=fences, queue=st.sampled_from(QueueKind), owner=st.sampled_from(OWNERS),
        tokens=st.lists(st.sampled_from(TOKENS), min_size=1, max_size=3, unique=True), served=SERVED,
    )
    def claim_batch(self, queue: QueueKind, owner: str, tokens: list[str], served: tuple[str, ...]) -> Any:
        actual = self.run(self.sources[queue].claim_batch_owned(owner, claim_tokens=tokens, **self.served(queue, served)))
        expected = self.model.claim_owned(queue, owner, tokens, self.clock.take(),
                                          served if queue is QueueKind.TASK else None)
        if expected[0] == "ok":
            expected = ("ok", [self.claimed_view(record) for record in expected[1]])
        self.expect(actual, expected)
        if actual[0] == "ok" and actual[1]:
            return multiple(*(claimed.claim_fence for claimed in actual[1]))
        return multiple()

    @rule(batch=st.lists(fences, min_size=1, max_size=3), data=st.data())
    def fenced_batch(self, batch: list[QueueClaimFence], data: st.DataObject) -> None:
        """complete_many_owned / heartbeat_many_owned / release_many_owned on one queue's source, whatever the
        fences' own queues (a fence of another queue must simply refuse itself)."""
        queue = batch[0].queue
        source = self.sources[queue]
        kind = data.draw(st.sampled_from(["complete", "heartbeat", "release"]), label="operation")
        if kind == "complete":
            results = [data.draw(st.sampled_from([None, {"n": index}]), label="result") for index in range(len(batch))]
            actual = self.run(source.complete_many_owned(list(zip(batch, results))))
            items = [(fence, {"result_json": None if r is None else canonical_json(r)}) for fence, r in zip(batch, results)]
            expected = self.model.fenced_many(queue, "complete", items, self.clock.take())
        elif kind == "heartbeat":
            actual = self.run(source.heartbeat_many_owned(batch))
            expected = self.model.fenced_many(queue, "heartbeat", [(fence, {}) for fence in batch], self.clock.take())
        else:
            actual = self.run(source.release_many_owned(batch))
            expected = self.model.fenced_many(queue, "release", [(fence, {}) for fence in batch], self.clock.take())
        self.expect(actual, expected)

    @rule(data=st.data())
    def batch_waits_for_a_row_locked_elsewhere(self, data: st.DataObject) -> None:
        """Another session holds one row of a batch locked while the batch runs: a
        lock-only holder, or an updating one that moves the row's lease to end during
        the hold. The batch waits for the lock and must then decide every row with a
        database time read after its last lock: the time the model is handed may not be
        earlier than the moment the lock was released. The batch is the fences of rows
        that were claimed with a token (current or stale), so it meets real rows."""
        with_tokens = {
            queue: sorted((r for r in self.model.rows[queue].values() if r.claim_token is not None), key=lambda r: r.job_id)
            for queue in QueueKind
        }
        # Two rows at least: a single row's lock wait is tests/adapters/postgres/test_postgres.py's; the
        # batch is where a clock read between two locks hides.
        queues = [queue for queue in QueueKind if len(with_tokens[queue]) >= 2]
        if not queues or self.contention_steps >= CONTENTION_STEPS_PER_RUN:
            return
        queue = data.draw(st.sampled_from(queues), label="queue")
        claimed = with_tokens[queue]
        chosen = data.draw(
            st.lists(st.sampled_from(claimed), min_size=2, max_size=3, unique_by=lambda r: r.job_id), label="rows"
        )
        batch = [QueueClaimFence(queue, r.job_id, r.owner_id or "", r.generation, r.claim_token or "") for r in chosen]
        held = data.draw(st.sampled_from(sorted(fence.job_id for fence in batch)), label="row held elsewhere")
        updating = data.draw(st.booleans(), label="the holder moves the lease")
        complete = data.draw(st.booleans(), label="complete (else heartbeat)")
        self.contention_steps += 1
        self.counter.races += 1  # the batch against another session's lock
        source = self.sources[queue]
        if complete:
            items = [(fence, {"n": index}) for index, fence in enumerate(batch)]
            call: Callable[[], Any] = lambda: source.complete_many_owned(items)
        else:
            call = lambda: source.heartbeat_many_owned(batch)
        holder = raw.RowHolder(self.database, self.db_url, queue, held, lease_ends_in_us=10_000 if updating else None)
        actual = self.run(holder.while_held(call))
        now = self.clock.take()
        assert holder.released_at_us is not None
        assert now >= holder.released_at_us, "the database time was read before the batch's last row lock"
        if holder.new_lease_us is not None:
            self.model.set_lease(queue, held, holder.new_lease_us)
        if complete:
            model_items = [(fence, {"result_json": canonical_json({"n": index})}) for index, fence in enumerate(batch)]
            expected = self.model.fenced_many(queue, "complete", model_items, now)
        else:
            expected = self.model.fenced_many(queue, "heartbeat", [(fence, {}) for fence in batch], now)
        self.expect(actual, expected)

    @rule(queue=st.sampled_from(PYCHARTER_QUEUES), owner=st.sampled_from(OWNERS))
    def claim_legacy(self, queue: QueueKind, owner: str) -> None:
        actual = self.run(self.sources[queue].claim_next(owner))
        expected = self.model.claim_legacy(queue, owner, self.clock.take())
        if expected[0] == "ok":
            expected = ("ok", self.claimed_view(expected[1]))
        self.expect(actual, expected)

    @rule(target=fences, queue=st.sampled_from(QueueKind), owner=st.sampled_from(OWNERS), token=st.sampled_from(TOKENS))
    def recover(self, queue: QueueKind, owner: str, token: str) -> Any:
        actual = self.run(self.sources[queue].recover_owned_claim(owner, claim_token=token))
        expected = self.model.recover(queue, owner, token, self.clock.take())
        expected = ("ok", self.claimed_view(expected[1]))
        self.expect(actual, expected)
        return actual[1].claim_fence if actual[1] is not None else QueueClaimFence(queue, "job-missing", owner, 1, token)

    # --- fenced writes ----------------------------------------------------------------------

    @rule(fence=fences, data=st.data())
    def fenced_write(self, fence: QueueClaimFence, data: st.DataObject) -> None:
        queue = fence.queue
        if data.draw(st.booleans(), label="near-miss fence"):
            fence = data.draw(st.sampled_from([
                dataclasses.replace(fence, owner_id=fence.owner_id.upper()),
                dataclasses.replace(fence, generation=fence.generation + 1),
                dataclasses.replace(fence, claim_token=fence.claim_token + " "),
            ]), label="changed fence")
        kinds = ["heartbeat", "complete", "fail", "release"]
        if queue is QueueKind.STREAMING:
            kinds += ["set_pid", "read_state", "acknowledge_cancel"]
        if queue is QueueKind.TASK:
            kinds += ["progress"]
        kind = data.draw(st.sampled_from(kinds), label="operation")
        source = self.sources[queue]
        arguments: dict[str, Any] = {}
        if kind == "heartbeat":
            actual = self.run(source.heartbeat_owned(fence))
        elif kind == "complete":
            results: list[Any] = [None, {"rows": 3}, {"nested": [1, "two"]}]
            if queue is QueueKind.TASK:  # a task's result is any JSON value (SQLite keeps a bare number's text too)
                results += [1.0, 9007199254740993, "done", [1, "two"], False]
            result = data.draw(st.sampled_from(results), label="result")
            arguments["result_json"] = None if result is None else canonical_json(result)
            actual = self.run(source.complete_owned(fence, result))
        elif kind == "fail":
            arguments.update(error="boom", retry=data.draw(st.booleans(), label="retry"))
            if queue is QueueKind.TASK:
                # A task's own retry policy, with a jitter drawn as the worker would.
                base, ceiling, jitter = data.draw(st.sampled_from([(0, 0, 0), (1, 4, 0), (1000, 5000, 500)]),
                                                  label="policy")
                arguments.update(backoff_base_ms=base, backoff_max_ms=ceiling, jitter_per_mille=jitter)
                actual = self.run(source.fail_owned(fence, "boom", retry=arguments["retry"],
                                                    policy=(base, ceiling, jitter > 0), jitter_per_mille=jitter))
            elif queue is not QueueKind.STREAMING:
                arguments["dlq_record_id"] = data.draw(st.none() | st.just("dlq-1"), label="dlq")
                actual = self.run(source.fail_owned(fence, "boom", retry=arguments["retry"], dlq_record_id=arguments["dlq_record_id"]))
            else:
                actual = self.run(source.fail_owned(fence, "boom", retry=arguments["retry"]))
        elif kind == "set_pid":
            arguments["pid"] = data.draw(st.integers(1, 9), label="pid")
            actual = self.run(source.set_pid_owned(fence, arguments["pid"]))
        elif kind == "read_state":
            actual = self.run(source.get_owned_state(fence))
        elif kind == "release":
            # At once, or given back for later (the delayed release a Run hop's worker
            # that does not serve its workflow uses): due a second or a day from now.
            delay_s = data.draw(st.sampled_from([0, 0, 1, 86_400]), label="delay_s")
            arguments["delay_us"] = delay_s * 1_000_000
            actual = self.run(source.release_owned(fence, delay_s=delay_s))
        elif kind == "progress":
            progress = data.draw(st.sampled_from([{"done": 1}, {"done": 2, "of": 3}]), label="progress")
            arguments["progress_json"] = canonical_json(progress)
            actual = self.run(source.progress_owned(fence, progress))
        else:
            actual = self.run(source.acknowledge_cancel_owned(fence))
        expected = self.model.fenced(queue, fence, kind, self.clock.take(), **arguments)
        self.expect(actual, self._as_reply(kind, expected))

    def _as_reply(self, kind: str, expected: tuple[Any, ...]) -> tuple[Any, ...]:
        from tenure.kernel import Applied
        from tenure.kernel.queue.commands import StreamingStateReply
        from tenure.model import OwnedStreamingState

        if expected[0] != "ok":
            return expected
        decision = expected[1]
        if kind == "read_state":
            if isinstance(decision, Applied) and isinstance(decision.reply, StreamingStateReply):
                return ("ok", OwnedStreamingState(decision.reply.cancel_requested, decision.reply.pid))
            return ("ok", None)
        return ("ok", isinstance(decision, Applied))

    # --- administrative and legacy by-ID operations ------------------------------------------

    @rule(queue=st.sampled_from(QueueKind), data=st.data())
    def by_id(self, queue: QueueKind, data: st.DataObject) -> None:
        job_id = data.draw(st.sampled_from(self.known_ids(queue)), label="job")
        kinds = ["heartbeat", "complete", "fail", "delete", "cancel"]
        if queue is QueueKind.STREAMING:
            kinds.append("set_pid")
        else:
            kinds.append("retry_failed")
        if queue is QueueKind.TASK:  # no legacy by-ID writes are offered on tasks
            kinds = ["delete", "cancel", "retry_failed"]
        kind = data.draw(st.sampled_from(kinds), label="operation")
        source = self.sources[queue]
        owner = data.draw(st.sampled_from(OWNERS), label="owner")
        retry = data.draw(st.booleans(), label="retry")
        calls = {
            "heartbeat": lambda: source.heartbeat(job_id, owner),
            "complete": lambda: source.complete(job_id, {"legacy": True}),
            "fail": lambda: source.fail(job_id, "legacy", retry=retry),
            "delete": lambda: source.delete_job(job_id),
            "cancel": lambda: source.cancel(job_id),
            "set_pid": lambda: source.set_pid(job_id, 7),
            "retry_failed": lambda: source.retry_failed(job_id),
        }
        actual = self.run(calls[kind]())
        model_kind = {"cancel": "request_cancel" if queue is QueueKind.STREAMING else "cancel_admin"}.get(kind, kind)
        expected = self.model.legacy(
            queue, job_id, model_kind, self.clock.take(), owner=owner, retry=retry, error="legacy",
            result_json='{"legacy":true}', pid=7,
        )
        self.expect(actual, self._as_reply(kind, expected))

    @rule(queue=st.sampled_from(QueueKind), older_than_s=st.sampled_from([0, 3600]))
    def purge(self, queue: QueueKind, older_than_s: int) -> None:
        import datetime as dt

        actual = self.run(self.sources[queue].purge_finished(dt.timedelta(seconds=older_than_s)))
        expected = self.model.purge(queue, older_than_s * 1_000_000, self.clock.take())
        self.expect(actual, expected)

    # --- the clock and the adversary ----------------------------------------------------------

    @rule(queue=st.sampled_from(QueueKind), data=st.data())
    def lease_runs_out(self, queue: QueueKind, data: st.DataObject) -> None:
        """The worker stalls: move a live lease two hours into the past in both worlds."""
        claimed = sorted(job_id for job_id, r in self.model.rows[queue].items() if r.lease_expires_at_us is not None)
        if not claimed:
            return
        job_id = data.draw(st.sampled_from(claimed), label="stalled job")
        raw.expire_lease(self.db_url, queue, job_id, LEASE_SHIFT_US)
        self.model.move_lease(queue, job_id, LEASE_SHIFT_US)
        self.counter.step()

    @rule(fence=fences)
    def heartbeat_racing_a_privileged_write(self, fence: QueueClaimFence) -> None:
        """Another writer changes the row after the engine read it: the compare-and-set must
        refuse to overwrite it with a decision made on the old row.

        On PostgreSQL a heartbeat is one decided-ahead statement, with no moment between
        its read and its write; the other writer's change lands just before it, after the
        row was last seen. The statement must then decide on the row as changed (one
        serial order: the other write, then the heartbeat), never write a decision made
        on the row it remembered. On SQLite the same holds for a row the source has seen;
        a row it has not seen is read in the heartbeat's transaction, and the other write
        lands between that read and the write, which must then fail (``row_changed``)."""
        queue = fence.queue
        if fence.job_id not in self.model.rows[queue]:
            return
        before_interference = self.model.rows[queue][fence.job_id]
        marker = f"interfered-{next(self.ids)}"
        self.counter.races += 1  # the heartbeat against another writer
        # On SQLite too, a row this source has seen is written from that row (no read in
        # the write's transaction): the other write lands just before it, as above.
        operations = self.sources[queue].operations
        known, seen_row, _ = operations.engine.last_seen(operations.binding, fence.job_id)
        with raw.interfering_after_load(self.database, queue, marker, self.db_url):
            actual = self.run(self.sources[queue].heartbeat_owned(fence))
        if self.database == "postgresql" or (known and seen_row is not None):
            self.model.interfere(queue, fence.job_id, marker)
            self.expect(actual, self._as_reply("heartbeat", self.model.fenced(queue, fence, "heartbeat", self.clock.take())))
            return
        now = self.clock.take()
        from tenure.kernel import QUEUE, Applied
        from tenure.kernel.queue.commands import ClaimFence, HeartbeatOwned

        decision = QUEUE.decide(before_interference, HeartbeatOwned(fence=ClaimFence.of(fence), lease_us=self.config.lease_us), now)
        if isinstance(decision, Applied) and decision.new_record != before_interference:
            expected: tuple[Any, ...] = ("error", "queue_persistence_failed", "row_changed")
        else:
            self.model.interfere(queue, fence.job_id, marker)
            expected = ("ok", isinstance(decision, Applied))
        self.expect(actual, expected)

    # --- after every step -----------------------------------------------------------------------

    @invariant()
    def every_row_equals_the_model(self) -> None:
        async def dump(tx: Any) -> dict[QueueKind, dict[str, Any]]:
            return {
                queue: {record.job_id: record
                        for record in await tx.find(binding_for(queue), finders.all_rows, {}, 10_000)}
                for queue in QueueKind
            }

        # One read transaction through store.run, as operations run (SQLite: one hop to
        # the connection's thread for the lot, not one per statement).
        store = self.sources[QueueKind.VALIDATION].store
        stored = self.runner.run(store.run(dump, write=False))
        for queue in QueueKind:
            assert stored[queue] == self.model.rows[queue], queue


