"""The Run aggregate: what each Run command reads and what its decision sets off, as data.

Theory of operation
-------------------
A Run command is decided on more than the Run row. The aggregate a command meets is the
Run with its current delivery (always: both are compared-and-set together), plus the
evidence the command carries (an owner row, containment counts, whether a session is
busy, the database clock for a timer's delay). A decision may also set off work beside
the pair: cancel the Run's pending consents, delete or bind its checkpoint, forget a
lost hop's recorded outcome (all in the same transaction), or publish the hop the
decision opened (the caller, after commit: a broker call never runs inside a
transaction). A refusal may set off work too: a worker's settle that the kernel refuses
because containment is unproven records the hop's outcome in the checkpoint row, in the
same transaction, so recovery settles the Run with it once contained (a refusal changes
nothing of the pair; the outcome is evidence beside it).

This module declares both, one table each, keyed by the command: :data:`READS` (what
the engine reads under the Run's lock, in that order, and which command field each
reading fills: :data:`FILLS`) and :data:`FOLLOW_UPS` (by the reply the decision gave,
or by the refusal's reason).
The engine (``tenure.adapters.runs.engine``) reads exactly what :data:`READS` names,
completes the command with it, asks the Run machine, persists the pair, runs the
in-transaction follow-ups and hands the after-commit ones back to its caller; it
branches on nothing else. ``specs/runs.md`` ("The Run aggregate") shows the same two
tables, and a test compares them both ways.

:data:`OWNER_COMMANDS` declares the same for the commands of the Run's owners that
touch the Run (a consent's creation and verdict, a delegated job's submission and end,
a service attempt's preparation): they lock the Run first and read whether it may open
an owner; a verdict or an end sets off the Run's resume (after commit, by the caller).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping

from .commands import (
    Ack,
    Admitted,
    Containment,
    Resumed,
    Rotated,
    RunCommandType,
    Settled,
    Swept,
)
from .machine import RunRefusal

__all__ = [
    "Evidence",
    "FollowUp",
    "OwnerCommand",
    "READS",
    "FILLS",
    "FOLLOW_UPS",
    "AFTER_COMMIT",
    "OWNER_COMMANDS",
    "UNREAD_CONTAINMENT",
    "DECIDED_AHEAD",
    "ADMITTED_AHEAD",
    "COUNTED_AHEAD",
    "IDLE_WHEN_NONE_COUNTED",
    "left_for_transaction",
    "COUNTED_WITH_PAIR",
    "WRITTEN_WITH_PAIR",
    "follow_ups",
    "on_refusal",
    "in_transaction",
    "after_commit",
]


class Evidence(enum.Enum):
    """What the engine reads for a command, under the Run's lock (values are the spec's)."""

    ADMISSION_LOCKS = "admission_locks"
    """The named locks of the admission's key and (with the session fence) its session,
    taken before the Run's own lock: same-key and same-session admissions queue up."""
    PAIR = "pair"
    """The Run and its current delivery, locked in that order (every command)."""
    KEY_HOLDER = "key_holder"
    """When no Run holds the derived ID: the Run that holds the admission's key (one
    admitted before ``runs_v4``), locked with its current delivery."""
    SESSION = "session"
    """With the session fence and no Run met: whether another nonterminal Run holds the
    session (``session_busy``)."""
    NAMED_OWNER = "named_owner"
    """The owner row the command names, by its kind and ID (None for a timer)."""
    RUN_OWNER = "run_owner"
    """The Run's persisted owner row, re-read (None for a timer)."""
    CONTAINMENT = "containment"
    """The Run's delegated jobs that are open or LOST and its service attempts that are
    not terminal, counted."""
    PENDING_CONSENTS = "pending_consents"
    """The Run's pending consents, counted: the consents a settled or cancelled Run's
    ``sweep_consents`` cancels (none: the sweep reads and writes nothing)."""
    PENDING_RECEIVES = "pending_receives"
    """The Run's receives still waiting for a message, counted: the receives a settled or
    cancelled Run's ``sweep_receives`` cancels (none: the sweep reads and writes nothing)."""
    CLOCK = "clock"
    """The database clock read after the lock, for a timer given as a delay (its due
    time is the clock plus the delay)."""


class FollowUp(enum.Enum):
    """What an applied decision sets off beside the pair (values are the spec's)."""

    SWEEP_CONSENTS = "sweep_consents"
    """Cancel the Run's pending consents, with the reply's ``decided_by`` (same transaction)."""
    SWEEP_RECEIVES = "sweep_receives"
    """Cancel the Run's pending receives, with the reply's ``decided_by`` (same
    transaction): a receive must never wait on a Run that will not resume."""
    DELETE_CHECKPOINT = "delete_checkpoint"
    """Delete the Run's checkpoint: the Run is terminal, the snapshot's debt paid (same transaction)."""
    CLEAR_OUTCOME = "clear_outcome"
    """Forget the outcome the lost hop recorded: the retried hop starts clean (same transaction)."""
    RECORD_OUTCOME = "record_outcome"
    """Record the hop's outcome (the settle's status, result or error, for its sequence)
    in the Run's checkpoint row, keeping the snapshot: a settle refused because
    containment is unproven, whose hop still holds the Run (the kernel refuses a hop
    that does not as stale or not running first). Recovery's ``settle_recorded`` settles
    the Run with it once contained. Written only when the caller handed the outcome over
    (the worker does; recovery's own settle of a recorded outcome does not write it
    again). Same transaction."""
    BIND_CHECKPOINT = "bind_checkpoint"
    """Write the checkpoint the caller handed over, bound to the owner the park names (a
    timer's park: the state and the wait in one transaction)."""
    PUBLISH_HOP = "publish_hop"
    """Publish the hop the decision opened (the caller, after commit, through its broker;
    the publish asks the kernel again whether the hop is publishable)."""
    RESUME_RUN = "resume_run"
    """The owner decided: resume the Run waiting on it (the caller, after commit)."""


AFTER_COMMIT = frozenset({FollowUp.PUBLISH_HOP, FollowUp.RESUME_RUN})
"""The follow-ups the caller runs after the transaction committed; every other one runs
inside the command's own transaction."""

UNREAD_CONTAINMENT = Containment(open_jobs=1, open_attempts=1)
"""The containment a caller builds a command with before the engine reads it: unproven,
so a declaration that forgot to name :attr:`Evidence.CONTAINMENT` refuses, never settles."""

C = RunCommandType
E = Evidence
F = FollowUp

READS: dict[RunCommandType, tuple[Evidence, ...]] = {
    C.ADMIT: (E.ADMISSION_LOCKS, E.PAIR, E.KEY_HOLDER, E.SESSION),
    C.RELEASE: (E.PAIR,),
    C.FAIL_HELD: (E.PAIR,),
    C.RECORD_PUBLISHED: (E.PAIR,),
    C.RECORD_PUBLISH_ERROR: (E.PAIR,),
    C.CLAIM: (E.PAIR,),
    C.ENTER_HARDWARE_WAIT: (E.PAIR,),
    C.LEAVE_HARDWARE_WAIT: (E.PAIR,),
    C.PARK: (E.PAIR, E.NAMED_OWNER, E.CLOCK),
    C.RESUME: (E.PAIR, E.RUN_OWNER),
    C.SETTLE: (E.PAIR, E.CONTAINMENT, E.PENDING_CONSENTS, E.PENDING_RECEIVES),
    C.BEGIN_CANCEL: (E.PAIR,),
    C.FINISH_CANCEL: (E.PAIR, E.CONTAINMENT, E.PENDING_CONSENTS, E.PENDING_RECEIVES),
    C.ROTATE: (E.PAIR,),
    C.RETRY_LOST: (E.PAIR, E.CONTAINMENT),
    C.TIME_OUT: (E.PAIR,),
}
"""What each command reads, in this order. Everything after the pair is read only when
the pair exists (a missing Run is refused ``not_found`` on its own)."""

FILLS: dict[Evidence, str | None] = {
    E.ADMISSION_LOCKS: None,
    E.PAIR: None,
    E.KEY_HOLDER: None,
    E.SESSION: "session_busy",
    E.NAMED_OWNER: "owner",
    E.RUN_OWNER: "owner",
    E.CONTAINMENT: "containment",
    E.PENDING_CONSENTS: None,
    E.PENDING_RECEIVES: None,
    E.CLOCK: "wake_at_us",
}
"""The command field each reading completes (None: it is the record, or a lock). A
reading with nothing to say (no delay for :attr:`Evidence.CLOCK`) leaves the field as
the caller built it."""

COUNTED_WITH_PAIR = frozenset({E.CONTAINMENT, E.PENDING_CONSENTS, E.PENDING_RECEIVES})
"""The evidence that is a count of rows, read in the same statement as the pair's lock
(one round trip for the Run, its delivery and every count its command names). A
database whose statement snapshot can be older than that statement's lock wait
(PostgreSQL) may count without the rows a writer holding the Run's lock committed
meanwhile, so the pair's write verifies every such count unchanged in its own statement
(one read after the lock) and writes nothing otherwise: the engine then counts again and
asks the kernel again. A refusal there, which writes no pair to verify them with, is
decided again on counts read after the lock too (a job that closed meanwhile may still
be counted open): a refused settle costs one more statement, never a wrong refusal."""

WRITTEN_WITH_PAIR = frozenset({F.DELETE_CHECKPOINT})
"""The in-transaction follow-ups that are deletes by the Run's key: written in the same
statement as the pair (the checkpoint a settle deletes)."""

FOLLOW_UPS: dict[RunCommandType, Mapping[type | RunRefusal, tuple[FollowUp, ...]]] = {
    C.ADMIT: {Admitted: (F.PUBLISH_HOP,)},
    C.RELEASE: {Ack: (F.PUBLISH_HOP,)},
    C.FAIL_HELD: {},
    C.RECORD_PUBLISHED: {},
    C.RECORD_PUBLISH_ERROR: {},
    C.CLAIM: {},
    C.ENTER_HARDWARE_WAIT: {},
    C.LEAVE_HARDWARE_WAIT: {},
    C.PARK: {Ack: (F.BIND_CHECKPOINT,)},
    C.RESUME: {Resumed: (F.PUBLISH_HOP,)},
    C.SETTLE: {Settled: (F.SWEEP_CONSENTS, F.SWEEP_RECEIVES, F.DELETE_CHECKPOINT),
               RunRefusal.CONTAINMENT_UNPROVEN: (F.RECORD_OUTCOME,)},
    C.BEGIN_CANCEL: {},
    C.FINISH_CANCEL: {Settled: (F.SWEEP_CONSENTS, F.SWEEP_RECEIVES), Swept: (F.SWEEP_CONSENTS, F.SWEEP_RECEIVES)},
    C.ROTATE: {Rotated: (F.PUBLISH_HOP,)},
    C.RETRY_LOST: {Rotated: (F.CLEAR_OUTCOME, F.PUBLISH_HOP)},
    C.TIME_OUT: {},
}
"""What a decision sets off, by the command and the reply it gave (applied) or the
reason it was refused (a reply or reason not listed sets off nothing; a refusal's
follow-ups run in the transaction, which then commits, and the refusal's error, if it
maps to one, is raised after the commit). :attr:`FollowUp.BIND_CHECKPOINT` writes only when the caller
handed a checkpoint over (``park_timer`` does); the consents a finished cancellation
sweeps keep their checkpoint for recovery's ``delete_checkpoint``, as before."""


DECIDED_AHEAD: frozenset[RunCommandType] = frozenset({
    C.RELEASE, C.FAIL_HELD, C.RECORD_PUBLISHED, C.RECORD_PUBLISH_ERROR, C.CLAIM, C.ENTER_HARDWARE_WAIT,
    C.LEAVE_HARDWARE_WAIT, C.BEGIN_CANCEL,
})
"""The commands a store with decided-ahead statements may decide ahead, from the pair last
seen, in one statement that locks the Run and its current delivery, checks both against
the pair decided on and the decision's window, and writes both: each reads nothing but
the pair (:data:`READS`), sets off nothing inside the transaction (:data:`FOLLOW_UPS`)
and writes the pair's two rows in place, never opening a delivery (``rotate`` reads
only the pair too, but opens the next delivery: an insert, so it keeps the transaction).
``tests/kernel/test_run_aggregate.py`` holds every one of them to that."""


ADMITTED_AHEAD: frozenset[RunCommandType] = frozenset({C.ADMIT})
"""The commands a store with decided-ahead statements may decide ahead when they create
the pair: an admission without the session fence, decided from no record, inserted in
one statement only if no Run holds its ID or its idempotency key (the
:attr:`Evidence.KEY_HOLDER` reading, made by the statement) and the clock lies in the
window; a Run met there is answered (a replay, or the refusal the kernel decides on
it). What the named admission lock guarantees (same-key admissions decide one after
another) the Run's primary key keeps: of two racing inserts the second writes nothing
and takes the transaction path, which waits on the lock and replays. With the session
fence the admission always takes the transaction (the session's lock, and the
:attr:`Evidence.SESSION` reading)."""


COUNTED_AHEAD: dict[RunCommandType, Mapping[Evidence, tuple[int, ...]]] = {
    C.SETTLE: {E.CONTAINMENT: (0, 0), E.PENDING_CONSENTS: (0,), E.PENDING_RECEIVES: (0,)},
}
"""The commands a store with decided-ahead statements may decide ahead although they read
counted evidence (:data:`COUNTED_WITH_PAIR`), with the counts each decision starts from:
a hop's settle in the common case, every effect contained and no consent pending. The
kernel decides from the pair last seen with those counts (each filling its command field
as in the transaction: :data:`FILLS`), and one statement locks the pair, counts what each
evidence names, and writes the pair (with the follow-ups written with it,
:data:`WRITTEN_WITH_PAIR`) only where the pair is unchanged, every count equals the one
decided on, the Run's row it locked is the one its snapshot sees, and the clock lies in
the window. Otherwise it answers the rows, the counts and whether they are current, and
the kernel decides again from them; a decision that sets off anything else in the
transaction (a sweep of pending consents, the outcome a refusal records:
:func:`left_for_transaction`), or counts the statement could not prove current, take the
transaction path (the reference).

Why the Run's row: a PostgreSQL statement counts in the snapshot it took when it began,
before it waited for the Run's lock, so it cannot see rows a writer holding that lock
committed meanwhile. Every writer that raises such a count (an owner's opening:
:data:`OWNER_COMMANDS` reading ``run_locked``, through ``finders.runs_opening_owners``)
locks the Run by writing its row (unchanged), so a statement whose snapshot predates that
commit locks a row its snapshot does not see, and writes nothing. A count that falls
meanwhile (a job ending takes no Run lock) only makes the statement write nothing."""


IDLE_WHEN_NONE_COUNTED: dict[FollowUp, Evidence] = {F.SWEEP_CONSENTS: E.PENDING_CONSENTS,
                                                     F.SWEEP_RECEIVES: E.PENDING_RECEIVES}
"""The in-transaction follow-ups that have nothing to do when the evidence they act on was
counted zero with the pair (and the count verified by the pair's write): no pending
consent, nothing to sweep."""


def left_for_transaction(
    command: RunCommandType, decision_reply: object, counted: Mapping[Evidence, tuple[int, ...]], *,
    refused: RunRefusal | None = None,
) -> tuple[FollowUp, ...]:
    """The in-transaction follow-ups a decision sets off that a decided-ahead statement
    does not do: every follow-up of a refusal (``refused``: its reason), and of an applied
    decision (its reply) those neither written with the pair nor idle on the counts it
    was decided on (:data:`IDLE_WHEN_NONE_COUNTED`). Empty: the statement does all of it."""
    if refused is not None:
        return on_refusal(command, refused)
    return tuple(step for step in in_transaction(command, decision_reply)
                 if step not in WRITTEN_WITH_PAIR and not (
                     step in IDLE_WHEN_NONE_COUNTED
                     and not any(counted.get(IDLE_WHEN_NONE_COUNTED[step], (1,)))))


class OwnerCommand(enum.Enum):
    """The commands of the Run's owners that touch the Run (values are the spec's)."""

    CONSENT_CREATE = "consent.create"
    CONSENT_DECIDE = "consent.decide"
    JOB_SUBMIT = "job.submit"
    JOB_ADOPT_RESULT = "job.adopt_result"
    JOB_RECORD_CANCELLED = "job.record_cancelled"
    ATTEMPT_PREPARE = "attempt.prepare"
    MESSAGE_SEND = "message.send"
    MESSAGE_RECEIVE = "message.receive"
    MESSAGE_TIME_OUT = "message.time_out"


O = OwnerCommand

OWNER_COMMANDS: dict[OwnerCommand, tuple[tuple[str, ...], tuple[FollowUp, ...]]] = {
    O.CONSENT_CREATE: (("run_locked", "consent"), ()),
    O.CONSENT_DECIDE: (("consent",), (F.RESUME_RUN,)),
    O.JOB_SUBMIT: (("run_locked", "job"), ()),
    O.JOB_ADOPT_RESULT: (("job",), (F.RESUME_RUN,)),
    O.JOB_RECORD_CANCELLED: (("job",), (F.RESUME_RUN,)),
    O.ATTEMPT_PREPARE: (("run_locked", "attempts_of_owner_job"), ()),
    O.MESSAGE_SEND: (("run_locked", "message"), (F.RESUME_RUN,)),
    O.MESSAGE_RECEIVE: (("run_locked", "message"), ()),
    O.MESSAGE_TIME_OUT: (("message",), (F.RESUME_RUN,)),
}
"""What each owner command reads (``run_locked``: the Run's row, locked first by writing
it unchanged, ``finders.runs_opening_owners``: see :data:`COUNTED_AHEAD`; as the
evidence whether it may open an owner) and what it sets off: a verdict or a job's end
lets the Run waiting on that owner resume (``resume_and_publish``, or the relays).
A message's send and a receive read the Run the same way (its status, or whether the
receiving hop holds it, and the slot they fill, take or store, under one lock); a send
that filled a waiting receive (``Delivered``) resumes the Run waiting on it, and a
receive's timeout resumes its Run like a verdict."""


def follow_ups(command: RunCommandType, reply: object) -> tuple[FollowUp, ...]:
    """What an applied decision of ``command`` with ``reply`` sets off."""
    return FOLLOW_UPS[command].get(type(reply), ())


def on_refusal(command: RunCommandType, reason: RunRefusal) -> tuple[FollowUp, ...]:
    """What a decision of ``command`` refused for ``reason`` sets off (in the transaction)."""
    return FOLLOW_UPS[command].get(reason, ())


def in_transaction(command: RunCommandType, reply: object) -> tuple[FollowUp, ...]:
    """The follow-ups the engine runs inside the command's transaction."""
    return tuple(step for step in follow_ups(command, reply) if step not in AFTER_COMMIT)


def after_commit(command: RunCommandType, reply: object) -> tuple[FollowUp, ...]:
    """The follow-ups the caller runs after commit."""
    return tuple(step for step in follow_ups(command, reply) if step in AFTER_COMMIT)
