"""The owned queue in its surroundings, for the explorer (:mod:`.engine`).

Theory of operation. The world is a few jobs (by default a validation job and a
streaming launch), three interchangeable workers, a client that submits and replays, an
operator, and the database clock. Each worker knows only what it was told: the fence of
the claim it believes it holds, or the token of a claim whose acknowledgement it never
received. The database is the kernel's records, changed only by the kernel's decisions
(:func:`tenure.kernel.queue.decide`) at the current database time; which row a command
meets follows the spec's "met row" column (a claim first sweeps every claimed row whose
lease ran out, then meets a pending row: any of them here, so every order a finder could
choose is explored).

Actions: the client submits a job, replays it, or replays it with changed content; a
worker claims (acknowledged, or the acknowledgement lost: the claim is stored, the worker
does not know), recovers a claim it lost the acknowledgement of, retries a claim with the
token it already used, and sends every fenced write its belief allows (heartbeat,
complete, fail with or without a retry, release; on the streaming launch also its PID and
its acknowledgement of a cancel), each acknowledged or lost; a worker crashes and
restarts, forgetting its belief; the operator cancels, reruns a failed job, or writes by
ID alone (the legacy API); the clock steps to the moment a lease ends or a retry falls due.
A message delayed in the network is the same as a worker that sends it later with what
it still believes, so stale writes need no messages in flight.

The properties (:data:`PROPERTIES`) are the queue's guarantees and its record invariants
(specs/queue.md), checked in every reachable state and on every transition.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Hashable, Iterator
from typing import Any

from tenure.model import JobStatus, QueueKind

from tenure.kernel.compiled import decider_of
from tenure.kernel.core import Applied, Decision
from tenure.kernel.queue.commands import (
    AcknowledgeCancelOwned,
    CancelAdmin,
    ClaimFence,
    ClaimOwned,
    CompleteLegacy,
    CompleteOwned,
    ExpireLease,
    FailLegacy,
    FailOwned,
    HeartbeatLegacy,
    HeartbeatOwned,
    ProgressOwned,
    RecoverOwned,
    ReleaseOwned,
    RequestCancel,
    RetryFailed,
    SetPidLegacy,
    SetPidOwned,
    SubmitLegacy,
    SubmitOwned,
)
from tenure.kernel.queue.finders import claim_finders
from tenure.kernel.queue.machine import QUEUE, backoff_delay_us, jittered_us
from tenure.kernel.queue.record import QueueRow, record_violations
from .engine import Property, Step

__all__ = ["QueueWorld", "Belief", "Last", "QueueModel", "PROPERTIES", "STANDARD", "SOAK"]

START_US = 1_800_000_000_000_000
LEASE_US = 30_000_000
HAND_BACK_US = 5_000_000
"""How much later a job given back by a worker that cannot run it is due."""
BACKOFF_BASE_MS, BACKOFF_MAX_MS, JITTER_PER_MILLE = 1000, 4000, 500
"""A retry waits: the largest jitter the kernel accepts, so a retry is due at a moment of its own."""
MAX_ATTEMPTS = 2
PAYLOADS: dict[QueueKind, tuple[str | None, ...]] = {
    QueueKind.VALIDATION: ("orders", "1", '{"data_source":"s","options":null}',
                           '{"fires_at":null,"job_id":null,"max_attempts":null}'),
    QueueKind.STREAMING: ("orders", "1", '{"force":false,"variables":null}', None),
    QueueKind.TASK: ('{"user_id":1}', '{"retry_base_ms":0,"retry_jitter":false,"retry_max_ms":0}', None),
}
TASK_PRIORITIES = (0, 50)
"""Two tasks of one queue: the later submitted is the more urgent, so order matters."""
SERVED = {0: ("emails",), 1: ("reports",), 2: ("emails", "reports")}
"""The task queues each worker serves (w2 serves only a queue no task is on)."""
_TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class _ByIdentity:
    """A memo keyed by an object's identity, holding the object so the identity stays
    its own (rows are shared by every world that did not change them: each is measured
    once, not once per world)."""

    def __init__(self, compute: Callable[..., Any]) -> None:
        self._compute = compute
        self._memo: dict[tuple[int, Any], tuple[Any, Any]] = {}

    def __call__(self, value: Any, extra: Any = None) -> Any:
        key = (id(value), extra)
        found = self._memo.get(key)
        if found is not None and found[0] is value:
            return found[1]
        answer = self._compute(value) if extra is None else self._compute(value, extra)
        self._memo[key] = (value, answer)
        return answer


@dataclasses.dataclass(frozen=True, slots=True)
class Belief:
    """What one worker knows: the fence it believes it holds, or the token of a claim
    whose acknowledgement it never received."""

    fence: ClaimFence | None = None
    lost_claim: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Last:
    """What the last step asked the kernel (ghost: for transition properties only)."""

    command: Any
    slot: int
    before: QueueRow | None
    applied: bool
    now_us: int


@dataclasses.dataclass(frozen=True, slots=True)
class QueueWorld:
    now_us: int
    rows: tuple[QueueRow | None, ...]
    workers: tuple[Belief, ...]
    tokens_issued: int = 0
    completions: tuple[tuple[int, int], ...] = ()
    """Ghost history: (job slot, generation) of every completion the kernel accepted."""
    last: tuple[Last, ...] = ()
    """Ghost: every kernel decision of the last step (a claim's sweep, then its claim)."""


def _job_id(slot: int) -> str:
    return f"job-{slot + 1}"


def _task_fields(kind: QueueKind, slot: int) -> dict[str, Any]:
    if kind is not QueueKind.TASK:
        return {}
    return {"queue_name": "emails", "task_name": "send", "priority": TASK_PRIORITIES[slot % 2]}


def _submit(kind: QueueKind, slot: int, fingerprint: str) -> SubmitOwned:
    return SubmitOwned(queue=kind, submission_id=f"sub-{slot + 1}", fingerprint=fingerprint, job_id=_job_id(slot),
                       run_id=None, fires_at_us=None, max_attempts=MAX_ATTEMPTS, idempotency_key=None,
                       active_key=f"streaming:orders@{slot + 1}" if kind is QueueKind.STREAMING else None,
                       payload=PAYLOADS[kind], **_task_fields(kind, slot))


def _submit_legacy(kind: QueueKind, slot: int) -> SubmitLegacy:
    return SubmitLegacy(queue=kind, job_id=_job_id(slot), run_id=None, fires_at_us=None, max_attempts=MAX_ATTEMPTS,
                        idempotency_key=None,
                        active_key=f"streaming:orders@{slot + 1}" if kind is QueueKind.STREAMING else None,
                        payload=PAYLOADS[kind], **_task_fields(kind, slot))


LEGACY_WRITES = (HeartbeatLegacy, CompleteLegacy, FailLegacy, SetPidLegacy)
"""Writes by job ID alone (pycharter's API): never on an owned claim."""


def _fence_of(row: QueueRow) -> ClaimFence:
    assert row.owner_id is not None and row.claim_token is not None
    return ClaimFence(queue=row.queue, job_id=row.job_id, owner_id=row.owner_id, generation=row.generation,
                      claim_token=row.claim_token)


class QueueModel:
    """Workers x jobs of the given kinds (see the module's docstring)."""

    def __init__(self, kinds: tuple[QueueKind, ...] = (QueueKind.VALIDATION, QueueKind.STREAMING),
                 workers: int = 3, *, legacy: bool = False, compiled: bool = False) -> None:
        self.kinds = kinds
        self.worker_count = workers
        self.legacy = legacy
        """Also pycharter's unprotected API: legacy submissions, and writes by job ID alone."""
        self.compiled = compiled
        """Decide the commands the queue machine compiles with their compiled deciders (the
        decisions the adapters' decided-ahead statements make, :func:`decider_of`) instead
        of :func:`~tenure.kernel.core.decide`: the worlds must be the same."""
        self.name = (f"queue: {workers} workers x {len(kinds)} jobs ({', '.join(kind.value for kind in kinds)})"
                     + (" + legacy API" if legacy else "") + (", compiled deciders" if compiled else ""))
        self.properties = PROPERTIES

    def _decide(self, record: QueueRow | None, command: Any, now_us: int) -> Decision:
        decider = decider_of(QUEUE, command.kind) if self.compiled else None
        ahead = None if decider is None else decider(record, command, now_us)
        return QUEUE.decide(record, command, now_us) if ahead is None else ahead.decision

    def _served(self, worker: int) -> tuple[str, ...] | None:
        return SERVED[worker % len(SERVED)] if QueueKind.TASK in self.kinds else None

    # --- the world -------------------------------------------------------------------

    def initial(self) -> QueueWorld:
        return QueueWorld(START_US, (None,) * len(self.kinds), (Belief(),) * self.worker_count)

    def _decided(self, world: QueueWorld, slot: int, command: Any, *, also: tuple[Last, ...] = ()
                 ) -> tuple[QueueWorld, bool, Any]:
        """The world after the kernel decides ``command`` on job ``slot`` (the row is
        written only when the decision applies)."""
        before = world.rows[slot]
        decision = self._decide(before, command, world.now_us)
        applied = isinstance(decision, Applied)
        rows = world.rows
        completions = world.completions
        reply: Any
        if isinstance(decision, Applied):
            rows = (*rows[:slot], decision.new_record, *rows[slot + 1:])
            if isinstance(command, CompleteOwned):
                completions = tuple(sorted((*completions, (slot, command.fence.generation))))
            reply = decision.reply
        else:
            reply = decision.reason
        last = (*also, Last(command, slot, before, applied, world.now_us))
        return QueueWorld(world.now_us, rows, world.workers, world.tokens_issued, completions, last), applied, reply

    def _with_belief(self, world: QueueWorld, worker: int, belief: Belief) -> QueueWorld:
        workers = (*world.workers[:worker], belief, *world.workers[worker + 1:])
        return QueueWorld(world.now_us, world.rows, workers, world.tokens_issued, world.completions, world.last)

    def successors(self, world: QueueWorld) -> Iterator[tuple[Step, QueueWorld]]:
        yield from self._client(world)
        for worker in range(self.worker_count):
            yield from self._worker(world, worker)
        yield from self._operator(world)
        yield from self._clock(world)

    def _client(self, world: QueueWorld) -> Iterator[tuple[Step, QueueWorld]]:
        for slot, kind in enumerate(self.kinds):
            first = world.rows[slot] is None
            if first and self.legacy:
                # An older client submits through pycharter's unprotected API; an owned
                # submission meeting its row must never adopt it.
                after, _, _ = self._decided(world, slot, _submit_legacy(kind, slot))
                yield Step("legacy client", "submit without protection", _job_id(slot)), after
            after, _, _ = self._decided(world, slot, _submit(kind, slot, f"v1:{_job_id(slot)}"))
            yield Step("client", "submit" if first else "replay", _job_id(slot)), after
            if not first:
                after, _, _ = self._decided(world, slot, _submit(kind, slot, "v1:changed"))
                yield Step("client", "replay with changed content", _job_id(slot)), after

    def _sweep(self, world: QueueWorld) -> tuple[QueueWorld, tuple[Last, ...]]:
        """Every claimed row whose lease is not after ``now`` (the sweep inside a claim)."""
        sweeps: list[Last] = []
        for slot, row in enumerate(world.rows):
            if row is not None and row.status is JobStatus.CLAIMED and (row.lease_expires_at_us or 0) <= world.now_us:
                world, _, _ = self._decided(world, slot, ExpireLease())
                sweeps.extend(world.last)
        return world, tuple(sweeps)

    def _worker(self, world: QueueWorld, worker: int) -> Iterator[tuple[Step, QueueWorld]]:
        name = f"w{worker + 1}"
        belief = world.workers[worker]
        if belief.fence is None and belief.lost_claim is None:
            token = f"t{world.tokens_issued + 1}"
            swept, sweeps = self._sweep(dataclasses.replace(world, tokens_issued=world.tokens_issued + 1))
            claimed_any = False
            for slot in range(len(self.kinds)):
                command = ClaimOwned(owner_id=name, claim_token=token, nonce_already_stored=False, lease_us=LEASE_US,
                                     queue_names=self._served(worker))
                after, applied, _ = self._decided(swept, slot, command, also=sweeps)
                if not applied:
                    continue
                claimed_any = True
                row = after.rows[slot]
                assert row is not None
                yield Step(name, "claim", _job_id(slot)), self._with_belief(after, worker, Belief(fence=_fence_of(row)))
                yield Step(name, "claim (ack lost)", _job_id(slot)), self._with_belief(
                    after, worker, Belief(lost_claim=token))
            if not claimed_any and sweeps:
                yield Step(name, "claim (nothing eligible; the sweep ran)"), dataclasses.replace(swept, last=sweeps)
        if belief.lost_claim is not None:
            token = belief.lost_claim
            stored = [slot for slot, row in enumerate(world.rows) if row is not None and row.claim_token == token]
            slot = stored[0] if stored else 0
            after, applied, _ = self._decided(world, slot, RecoverOwned(owner_id=name, claim_token=token))
            row = after.rows[slot]
            learned = Belief(fence=_fence_of(row)) if applied and row is not None else Belief()
            yield Step(name, "recover its claim"), self._with_belief(after, worker, learned)
            # A worker that retries its claim with the same token (never how tenure's worker
            # recovers, but a caller may): the stored nonce must refuse it.
            swept, sweeps = self._sweep(world)
            for slot in range(len(self.kinds)):
                command = ClaimOwned(owner_id=name, claim_token=token, nonce_already_stored=bool(stored),
                                     lease_us=LEASE_US, queue_names=self._served(worker))
                after, applied, _ = self._decided(swept, slot, command, also=sweeps)
                if applied:
                    yield Step(name, "claim again with its used token", _job_id(slot)), after
        if belief.fence is not None:
            yield from self._fenced(world, worker, name, belief.fence)
        if belief != Belief():
            yield Step(name, "crash and restart"), self._with_belief(dataclasses.replace(world, last=()), worker,
                                                                      Belief())

    def _fenced(self, world: QueueWorld, worker: int, name: str, fence: ClaimFence
                ) -> Iterator[tuple[Step, QueueWorld]]:
        slot = int(fence.job_id.rsplit("-", 1)[1]) - 1
        writes: list[tuple[str, Any, bool]] = [
            ("heartbeat", HeartbeatOwned(fence=fence, lease_us=LEASE_US), True),
            ("complete", CompleteOwned(fence=fence, result_json='{"rows":3}'), False),
            ("fail with a retry", FailOwned(fence=fence, error_message="boom", retry=True, dlq_record_id=None,
                                            backoff_base_ms=BACKOFF_BASE_MS, backoff_max_ms=BACKOFF_MAX_MS,
                                            jitter_per_mille=JITTER_PER_MILLE), False),
            ("fail for good", FailOwned(fence=fence, error_message="boom", retry=False, dlq_record_id=None,
                                        backoff_base_ms=BACKOFF_BASE_MS, backoff_max_ms=BACKOFF_MAX_MS), False),
            ("release", ReleaseOwned(fence=fence), False),
            # A worker that cannot run the job (a Run hop of a version it does not serve)
            # gives it back for another worker, due a little later.
            ("give back for later", ReleaseOwned(fence=fence, delay_us=HAND_BACK_US), False),
        ]
        writes.append(("report progress", ProgressOwned(fence=fence, progress_json='{"done":1}'), True))
        if fence.queue is QueueKind.STREAMING:
            writes += [("record its pid", SetPidOwned(fence=fence, pid=7), True),
                       ("acknowledge the cancel", AcknowledgeCancelOwned(fence=fence), False)]
        # A fence that is not the one handed out (a client that rebuilt it wrongly: another
        # worker's name, an earlier generation, another claim's token) must never write.
        others = [f"w{other + 1}" for other in range(self.worker_count) if f"w{other + 1}" != fence.owner_id]
        for forged in (dataclasses.replace(fence, owner_id=others[0]),
                       dataclasses.replace(fence, generation=fence.generation - 1),
                       dataclasses.replace(fence, claim_token=fence.claim_token + "'")):
            if forged.generation < 0:
                continue
            forged_writes: list[tuple[str, Any]] = [("complete", CompleteOwned(fence=forged, result_json=None))]
            if fence.queue is QueueKind.TASK:
                forged_writes.append(("report progress", ProgressOwned(fence=forged, progress_json='{"done":2}')))
            for action, command in forged_writes:
                after, applied, _ = self._decided(world, slot, command)
                if applied:
                    yield Step(name, f"{action} with a forged fence", _job_id(slot)), after
        for action, command, keeps in writes:
            after, applied, _ = self._decided(world, slot, command)
            # A refused write changes nothing but the worker's belief (it learns its claim
            # is gone): the same world as its crash, so it is not explored again.
            if not applied:
                continue
            yield Step(name, action, _job_id(slot)), self._with_belief(
                after, worker, Belief(fence=fence) if keeps else Belief())
            if not keeps:  # a lost acknowledgement of a write that keeps the claim changes nothing
                yield Step(name, f"{action} (ack lost)", _job_id(slot)), after

    def _operator(self, world: QueueWorld) -> Iterator[tuple[Step, QueueWorld]]:
        for slot, kind in enumerate(self.kinds):
            if world.rows[slot] is None:
                continue
            cancel = RequestCancel() if kind is QueueKind.STREAMING else CancelAdmin()
            by_id = () if not self.legacy else (("heartbeat by ID alone", HeartbeatLegacy(owner_id="w1", lease_us=LEASE_US)),
                     ("complete by ID alone", CompleteLegacy(result_json=None)),
                     ("fail by ID alone", FailLegacy(error_message="legacy", retry=False, dlq_record_id=None,
                                                     backoff_base_ms=0, backoff_max_ms=0)),
                     ("record a PID by ID alone", SetPidLegacy(pid=9)))
            for action, command in (("cancel", cancel), ("rerun a failed job", RetryFailed()), *by_id):
                after, applied, _ = self._decided(world, slot, command)
                if applied:
                    yield Step("operator", action, _job_id(slot)), after

    def _clock(self, world: QueueWorld) -> Iterator[tuple[Step, QueueWorld]]:
        moments: set[tuple[int, str]] = set()
        for row in world.rows:
            if row is None:
                continue
            if row.status is JobStatus.CLAIMED and row.lease_expires_at_us is not None \
                    and row.lease_expires_at_us > world.now_us:
                moments.add((row.lease_expires_at_us, "to the end of a lease"))
            if row.status is JobStatus.PENDING and row.fires_at_us > world.now_us:
                moments.add((row.fires_at_us, "to a retry's due time"))
        for moment, why in sorted(moments):
            yield Step("clock", f"steps {why}", f"(+{(moment - world.now_us) / 1e6:g} s)"), dataclasses.replace(
                world, now_us=moment, last=())

    # --- canonical form and description -----------------------------------------------------

    def canonical(self, world: QueueWorld) -> Hashable:
        """The world with its workers renamed (first those that own a row, in job order,
        then the others by what they believe), tokens renamed in order of appearance, and
        instants relative to the clock."""
        appearing = [row.owner_id for row in world.rows if row is not None and row.owner_id is not None]
        order = [int(owner[1:]) - 1 for owner in dict.fromkeys(appearing)]

        def anonymous(belief: Belief) -> Any:
            fence = belief.fence
            return (None if fence is None else (fence.job_id, fence.generation), belief.lost_claim is not None)

        rest = sorted((worker for worker in range(self.worker_count) if worker not in order),
                      key=lambda worker: repr(anonymous(world.workers[worker])))
        order += rest
        owners = {f"w{old + 1}": f"w{new + 1}" for new, old in enumerate(order)}
        tokens: dict[str, str] = {}

        def token(value: str | None) -> str | None:
            if value is None:
                return None
            return tokens.setdefault(value, f"T{len(tokens)}")

        rows: list[tuple[Any, str | None, Any] | None] = []
        for row in world.rows:
            if row is None:
                rows.append(None)
                continue
            owner, claim_token, rest = _relative_row(row, world.now_us)
            rows.append((owners.get(owner, owner), token(claim_token), rest))
        beliefs = tuple(self._belief_form(world.workers[old], owners, token) for old in order)
        return tuple(rows), beliefs, world.completions

    @staticmethod
    def _belief_form(belief: Belief, owners: dict[str, str], token: Callable[[str | None], str | None]) -> Any:
        fence = belief.fence
        fence_form = None if fence is None else (fence.job_id, owners.get(fence.owner_id, fence.owner_id),
                                                 fence.generation, token(fence.claim_token))
        return fence_form, token(belief.lost_claim)

    def describe(self, world: QueueWorld) -> str:
        parts = []
        for slot, row in enumerate(world.rows):
            if row is None:
                parts.append(f"{_job_id(slot)} absent")
                continue
            text = f"{_job_id(slot)} {row.status.value} g{row.generation} a{row.attempts}"
            if row.status is JobStatus.CLAIMED:
                text += f" {row.owner_id}/{row.claim_token} lease {(row.lease_expires_at_us or 0) - world.now_us:+d}us"
                if row.cancel_requested:
                    text += " cancel requested"
            elif row.status is JobStatus.PENDING and row.fires_at_us > world.now_us:
                text += f" due {row.fires_at_us - world.now_us:+d}us"
            parts.append(text)
        for worker, belief in enumerate(world.workers):
            if belief.fence is not None:
                parts.append(f"w{worker + 1} holds {belief.fence.job_id}/g{belief.fence.generation}")
            elif belief.lost_claim is not None:
                parts.append(f"w{worker + 1} lost its claim's ack ({belief.lost_claim})")
        return "; ".join(parts)


def _deadline(instant: int, now_us: int, exact: bool) -> int | str:
    """A lease end or a due time relative to now. Past ones are all alike to every
    decision the modelled commands make (each compares them with now only), so they are
    one value, except where a finder orders rows by them (tasks); now itself stays apart
    (a lease ending exactly now is over)."""
    relative = instant - now_us
    return relative if relative >= 0 or exact else "past"


def _relative(row: QueueRow, now_us: int) -> tuple[str | None, str | None, tuple[Any, ...]]:
    """(owner, token, everything else the canonical form keeps). Lease ends and due times
    are relative to now (:func:`_deadline`); of the instants no modelled decision reads
    (created, claimed, completed) only their presence is kept, which is what the record
    invariants ask of them."""
    exact = row.queue is QueueKind.TASK
    instants = (
        None if row.lease_expires_at_us is None else _deadline(row.lease_expires_at_us, now_us, exact),
        _deadline(row.fires_at_us, now_us, exact),
        row.claimed_at_us is None, row.completed_at_us is None,
    )
    return row.owner_id, row.claim_token, (
        row.status.value, row.attempts, row.generation, instants, row.cancel_requested, row.pid, row.active_key,
        row.error_message, row.result_json, row.dlq_record_id, row.fingerprint)


_relative_row = _ByIdentity(_relative)
_violations_of = _ByIdentity(lambda row: tuple(record_violations(row)))


# --- properties ---------------------------------------------------------------------------


def _records_keep_their_invariants(world: QueueWorld) -> str | None:
    for row in world.rows:
        if row is not None and _violations_of(row):
            return f"{row.job_id}: {', '.join(_violations_of(row))}"
    return None


def _one_completion_per_generation(world: QueueWorld) -> str | None:
    for (slot, generation), group in itertools.groupby(world.completions):
        if len(list(group)) > 1:
            return f"{_job_id(slot)} generation {generation} was completed twice"
    return None


def _lives(row: QueueRow, fence: ClaimFence, now_us: int) -> bool:
    return (row.status is JobStatus.CLAIMED and row.owner_id == fence.owner_id and row.generation == fence.generation
            and row.claim_token == fence.claim_token and row.lease_expires_at_us is not None
            and row.lease_expires_at_us > now_us)


def _writes_only_from_the_current_fence(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        fence = getattr(last.command, "fence", None)
        if fence is not None and last.applied and (last.before is None or not _lives(last.before, fence, last.now_us)):
            return f"{type(last.command).__name__} was accepted from a fence that is not the live claim"
        if isinstance(last.command, LEGACY_WRITES) and last.applied and last.before is not None \
                and last.before.status is JobStatus.CLAIMED and last.before.claim_token is not None:
            return f"an owned claim was written by {type(last.command).__name__}, which names no fence"
    return None


def _claims_respect_tokens_and_due_times(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        if not isinstance(last.command, ClaimOwned) or not last.applied:
            continue
        if last.command.nonce_already_stored:
            return "a claim token that was already stored claimed again"
        row = last.before
        assert row is not None
        if row.fires_at_us > last.now_us:
            return f"{row.job_id} was claimed before it was due"
        served = last.command.queue_names
        if row.queue is QueueKind.TASK and served is not None and row.queue_name not in served:
            return f"{row.job_id} ({row.queue_name}) was claimed by a worker serving only {', '.join(served)}"
        if row.generation >= after.rows[last.slot].generation:  # type: ignore[union-attr]
            return f"{row.job_id}'s claim did not advance its generation"
    return None


def _claims_take_the_most_urgent_task_first(world: QueueWorld) -> str | None:
    """The kernel's claim finder (data the stores compile) orders due tasks as the spec
    says: highest priority first, then the earliest due, then the smallest job ID."""
    rows = [row for row in world.rows if row is not None and row.queue is QueueKind.TASK]
    if len(rows) < 2:
        return None
    eligible, _ = claim_finders(QueueKind.TASK, owned=True)
    parameters = {"now": world.now_us, "queues": ("emails", "reports"), "queue": "emails"}
    chosen = eligible.sorted(row for row in rows if eligible.matches(row, parameters))
    expected = sorted(chosen, key=lambda row: (-row.priority, row.fires_at_us, row.job_id))
    if [row.job_id for row in chosen] != [row.job_id for row in expected]:
        return f"the claim finder takes {', '.join(row.job_id for row in chosen)} in that order"
    return None


def _progress_only_on_tasks(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        if isinstance(last.command, ProgressOwned) and last.applied and last.before is not None \
                and last.before.queue is not QueueKind.TASK:
            return f"progress was recorded on {last.before.queue.value} {last.before.job_id}, which is not a task"
    return None


def _replays_keep_the_admitted_submission(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        if isinstance(last.command, SubmitOwned) and last.before is not None:
            if after.rows[last.slot] != last.before:
                return f"a replay changed the admitted {last.before.job_id}"
            if last.applied and last.command.fingerprint != last.before.fingerprint:
                return f"a replay with changed content was answered as {last.before.job_id}'s replay"
    return None


def _finished_jobs_stay_finished(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    """COMPLETED and CANCELLED are final; FAILED leaves only for a rerun of a validation
    or pipeline job (a stream never reruns)."""
    for old, new in zip(before.rows, after.rows):
        if old is None or old.status not in _TERMINAL or new == old:
            continue
        rerun = (old.status is JobStatus.FAILED and new is not None and new.status is JobStatus.PENDING
                 and old.queue is not QueueKind.STREAMING)
        if not rerun:
            return f"finished {old.job_id} ({old.status.value}) became {'absent' if new is None else new.status.value}"
        if new is not None and new.attempts != 0:
            return f"{old.job_id}'s rerun kept {new.attempts} spent attempts"
    return None


def _cancel_requests_are_honoured(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for old, new in zip(before.rows, after.rows):
        if old is not None and new is not None and old.cancel_requested and old.status is JobStatus.CLAIMED \
                and new.status in (JobStatus.COMPLETED, JobStatus.PENDING):
            return f"{old.job_id} had a cancel request and became {new.status.value}"
    return None


def _release_returns_the_attempt(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        if isinstance(last.command, ReleaseOwned) and last.applied and last.before is not None:
            new = after.rows[last.slot]
            assert new is not None
            if new.attempts != max(last.before.attempts - 1, 0) or new.generation != last.before.generation:
                return f"a release of {new.job_id} spent or moved its attempt or generation"
            due = last.now_us + last.command.delay_us if last.command.delay_us > 0 else last.before.fires_at_us
            if new.fires_at_us != due:
                return f"a release of {new.job_id} is due at {new.fires_at_us - last.now_us:+d}us, not at its delay"
            if last.before.pid is not None:
                return f"{new.job_id} was released while its launch was running (PID recorded)"
    return None


def _retries_wait_their_backoff(before: QueueWorld, step: Step, after: QueueWorld) -> str | None:
    for last in after.last:
        command = last.command
        if isinstance(command, FailOwned) and command.retry and last.applied and last.before is not None:
            new = after.rows[last.slot]
            if new is None or new.status is not JobStatus.PENDING:
                continue
            delay = backoff_delay_us(last.before.attempts, command.backoff_base_ms, command.backoff_max_ms)
            if new.fires_at_us != last.now_us + jittered_us(delay, command.jitter_per_mille) \
                    or new.fires_at_us < last.now_us + delay // 2:
                return f"{new.job_id}'s retry is due {new.fires_at_us - last.now_us} us on, not after its backoff"
    return None


def _no_job_lost(world: QueueWorld) -> str | None:
    """Every submitted job can still finish: a fresh worker, given time, claims each job
    that is not finished and completes it (or, with a cancel request, acknowledges it)."""
    rows = list(world.rows)
    now = world.now_us
    for round_number in range(2 * len(rows) + 2):
        open_rows = [row for row in rows if row is not None and row.status not in _TERMINAL]
        if not open_rows:
            return None
        now = max([now + 1, *(row.lease_expires_at_us or 0 for row in open_rows),
                   *(row.fires_at_us for row in open_rows if row.status is JobStatus.PENDING)])
        for slot, row in enumerate(rows):
            if row is None or row.status in _TERMINAL:
                continue
            current: QueueRow | None = row
            token = f"rescue-{round_number}-{slot}"
            for command in (ExpireLease(), ClaimOwned(owner_id="rescuer", claim_token=token,
                                                      nonce_already_stored=False, lease_us=LEASE_US)):
                decision = QUEUE.decide(current, command, now)
                if isinstance(decision, Applied):
                    current = decision.new_record
            if current is not None and current.status is JobStatus.CLAIMED and current.owner_id == "rescuer":
                fence = _fence_of(current)
                finish = AcknowledgeCancelOwned(fence=fence) if current.cancel_requested else CompleteOwned(
                    fence=fence, result_json=None)
                decision = QUEUE.decide(current, finish, now)
                if isinstance(decision, Applied):
                    current = decision.new_record
            rows[slot] = current
    stuck = [row.job_id for row in rows if row is not None and row.status not in _TERMINAL]
    return None if not stuck else f"{', '.join(stuck)} can no longer reach a finished state"


PROPERTIES: tuple[Property[QueueWorld], ...] = (
    Property("records_keep_their_invariants", "INV-Q1..INV-Q10",
             "every stored row keeps the record invariants", state=_records_keep_their_invariants),
    Property("one_completion_per_generation", "specs/queue.md complete_owned",
             "at most one completion is accepted per job and generation", state=_one_completion_per_generation),
    Property("writes_only_from_the_current_fence", "specs/queue.md fenced methods; legacy writes",
             "a fenced write applies only while its fence is the live claim; no write without a fence finishes "
             "an owned claim", step=_writes_only_from_the_current_fence),
    Property("claims_respect_tokens_and_due_times", "specs/queue.md claim_owned",
             "a stored claim token never claims again, nothing is claimed before it is due or from a task queue "
             "the claim does not serve, every claim advances the generation",
             step=_claims_respect_tokens_and_due_times),
    Property("claims_take_the_most_urgent_task_first", "specs/queue.md met rows (claim_owned)",
             "the claim finder orders due tasks by priority, then due time, then job ID",
             state=_claims_take_the_most_urgent_task_first),
    Property("progress_only_on_tasks", "specs/queue.md progress_owned",
             "only a task records progress", step=_progress_only_on_tasks),
    Property("replays_keep_the_admitted_submission", "specs/queue.md submit_owned",
             "a replay changes nothing, and changed content is refused", step=_replays_keep_the_admitted_submission),
    Property("finished_jobs_stay_finished", "specs/queue.md retry_failed; INV-Q9",
             "completed and cancelled jobs never change; a failed one only reruns, with a fresh budget, and never "
             "a stream", step=_finished_jobs_stay_finished),
    Property("cancel_requests_are_honoured", "specs/queue.md complete_owned, release_owned, expire_lease",
             "a claimed stream with a cancel request is never completed or put back", step=_cancel_requests_are_honoured),
    Property("release_returns_the_attempt", "specs/queue.md release",
             "a release gives back its attempt, keeps the generation, is due at once or after its delay, and never "
             "releases a running launch",
             step=_release_returns_the_attempt),
    Property("retries_wait_their_backoff", "specs/queue.md retry",
             "a retried job is due after its backoff less at most half of it", step=_retries_wait_their_backoff),
    Property("no_job_lost", "specs/queue.md expire_lease; INV-Q4",
             "every submitted job can still reach a finished state", state=_no_job_lost),
)

STANDARD: list[tuple[QueueModel, int]] = [
    (QueueModel(), 12),
    (QueueModel((QueueKind.VALIDATION,), 2, legacy=True), 12),
    (QueueModel((QueueKind.TASK, QueueKind.TASK), 2), 12),
]
"""The standard bounds, each 12 actions deep (CI's suite explores the last two; ``bash
.ci/soak`` all three):

* 3 workers x 2 jobs (a validation job and a streaming launch) on the owned API: enough
  for both jobs to be submitted, claimed, lost to a lease, claimed again by another
  worker, and then written by the first worker's stale fence, with lost acknowledgements
  and crashes in between; the shortest trace of every queue mutant this world reaches is
  at most 6 actions, so 12 leaves room for each to happen twice over, interleaved;
* 2 workers x 1 validation job with pycharter's unprotected API beside the owned one
  (legacy submissions and writes by job ID alone);
* 2 workers x 2 tasks of one queue (different priorities; one worker serves another
  queue), with progress writes.

``python -m tenure.conformance.explore`` prints each one's states, transitions and
depth."""

SOAK: list[tuple[QueueModel, int]] = [
    (QueueModel(), 14),
    (QueueModel((QueueKind.VALIDATION, QueueKind.STREAMING), 2, legacy=True), 12),
    (QueueModel((QueueKind.TASK, QueueKind.TASK), 3), 12),
]
"""Larger bounds for a soak (``python -m tenure.conformance.explore --soak``): hours of
one core for the first."""
