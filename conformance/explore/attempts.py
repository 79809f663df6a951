"""The service-attempt machine in its surroundings, for the explorer (:mod:`.engine`).

Theory of operation
-------------------
A small closed world around one owner job's service attempt (``specs/attempts.md``).
Every decision is the kernel's own (``ATTEMPTS.decide``, :mod:`tenure.kernel.attempts.machine`, on the
row the command meets: the generation's row, or none before ``prepare``); the model adds
only what surrounds the machine:

- two *senders* (runners; interchangeable). A sender's only local knowledge is the
  transmission it was granted and what its driver call answered: an acknowledgement with
  a job identity, a definite rejection, or nothing certain. It may crash (forgetting
  that; a transmission granted but not yet sent then never leaves), and any write may be
  applied with its answer lost (a lost grant is never sent; a lost report is held and may
  be sent again);
- a *reconciler* (a restarted process, a relay): looks the key up where the provider
  offers lookups, polls a recorded identity, ends a submit lease, reports what the
  provider confirmed (a stop, a callback). It keeps nothing between actions, except
  where ``Configuration.stale_lookups`` lets a not-found wait before its ``reconcile``;
- the *operator*: a cancel request, the reservation's release, and the closing of the
  Run the attempt names (the Run ledger closes a Run only when none of its attempts is
  open, "Attempts of a Run");
- the *provider*'s true state: its jobs under each key and their states, and for every
  granted transmission what it truly did (still in flight, never sent, no effect, an
  effect, a same-key replay). A transmission reaches the provider only while its submit
  lease is live (the runner bounds its driver call by it). The provider honours its kind
  (:data:`PROVIDERS`, as in ``tests/support/attempt_fakes.py``): ``replay`` answers a key
  that has a job with that job (so never rejects it), lookups answer found / not found /
  failed as its state allows, ``neither`` is only polled by a known identity, ``lying``
  answers a replay with a new identity and no new effect;
- the database clock, which moves only to the end of the earliest live submit lease
  (the one kind of instant an attempt decision compares with now).

Every command an actor may send is tried in every world; a refusal that changes nothing
is not a transition. Ghost history the properties need (what each transmission truly
did) is part of the world; ``World.last`` (the last step's command and decision, for the
transition rules) is left out of equality and of the canonical key. The canonical key
sorts the senders, expresses every instant relative to the clock (instants already past
are all alike to every later decision), and leaves out the evidence log, which no guard,
effect or property reads (the tests check both on every decision of the standard worlds).

The properties (:data:`WORLD_PROPERTIES`) are the guarantees as the world sees them;
:data:`KERNEL_CHECKS` adds the kernel's own record invariants and transition rules on
every record and decision reached. The standard worlds let in every surrounding the
configuration knows (see :data:`STANDARD` for the three the kernel once needed left out).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Hashable, Iterator
from typing import Any

from tenure.model import ENVELOPE_TAG, TERMINAL_ATTEMPT_STATES, AttemptState

from tenure.kernel.attempts import finders
from tenure.kernel.attempts.commands import (
    AttemptCommand,
    BeginSubmit,
    ExpireSubmitLease,
    FailureKind,
    LookupKind,
    Prepare,
    Reconcile,
    RecordAccepted,
    RecordAmbiguous,
    RecordCancelled,
    RecordFailed,
    RecordRunning,
    RecordSucceeded,
    ReleaseReservation,
    RequestCancel,
    TransmissionGranted,
)
from tenure.kernel.attempts.machine import ATTEMPTS, transition_violations
from tenure.kernel.attempts.record import AttemptRow, record_violations, replace_fields
from tenure.kernel.core import Applied, Decision, Refused
from .engine import Property, Step

__all__ = [
    "Configuration",
    "World",
    "AttemptModel",
    "PROPERTIES",
    "WORLD_PROPERTIES",
    "KERNEL_CHECKS",
    "STANDARD",
    "SOAK",
    "PROVIDERS",
]

NOW_US = 1_800_000_000_000_000
"""The database clock at the start (any instant: everything is kept relative to it)."""
LEASE_US = 60_000_000
"""The submit lease (the ledger's default, 60 s)."""

PROVIDERS = {
    # kind: (same-key replay, lookup, answers a replayed key with a new identity)
    "replay": (True, True, False),
    "lookup_only": (False, True, False),
    "neither": (False, False, False),
    "lying": (True, True, True),
}
"""The provider kinds of ``tests/support/attempt_fakes.py``, by their guarantees."""

_DIGEST = "sha256:" + "5" * 64
_INSTANTS = ("created_at_us", "updated_at_us", "submit_lease_expires_at_us")
_KEYED = operator.attrgetter(*(name for name in AttemptRow.__slots__ if name not in (*_INSTANTS, "evidence")))
"""Every field of a row but its instants (which the canonical key keeps relative to the
clock) and its evidence log (history: appended to by observations, read by no guard, no
effect and no property, and far below its bound of 256 entries at these depths; the
tests check that no decision of a reachable world changes without it)."""
_ACTIVE = (AttemptState.ACCEPTED, AttemptState.RUNNING)
def _not_found(looked_up_at_us: int) -> Reconcile:
    """A lookup's honest not-found, made at ``looked_up_at_us``: a provider that offers
    lookups vouches for it."""
    return Reconcile(lookup=LookupKind.NOT_FOUND, proves_no_effect=True, looked_up_at_us=looked_up_at_us)

# What a granted transmission truly did (ghost history).
PENDING = "pending"  # its sender holds it; it reaches the provider only while its lease is live
NEVER_SENT = "never_sent"  # its sender crashed before sending, or its lease ended first
NO_EFFECT = "no_effect"  # it reached the provider, which did nothing (rejected, or a disconnect before)
EFFECT = "effect"  # it made a new job
REPLAYED = "replayed"  # a same-key replay: answered with the key's job, no new effect

# A sender's local knowledge: (phase, generation index, transmission number, driver outcome).
IDLE = ("idle", 0, 0, "")
GRANTED = "granted"
SENT = "sent"
REJECTED = "rejected"
AMBIGUOUS = "ambiguous"


@dataclasses.dataclass(frozen=True, slots=True)
class Configuration:
    """One bound of the world."""

    provider: str = "lookup_only"
    """A kind of :data:`PROVIDERS`."""
    senders: int = 2
    generations: int = 1
    """Attempts of the owner job the world may prepare (a retry is the next generation)."""
    transmissions: int = 2
    """Transmissions a sender asks for per attempt at most (the bound that keeps the world
    finite: proven resubmissions could otherwise go on forever)."""
    stale_reports: bool = True
    """Whether a sender's report of its driver's answer may reach the kernel after another
    transmission of the attempt was granted (a pause longer than the submit lease, or a
    concurrent sender on a replay binding). A rejection names the transmission it answers,
    so the kernel refuses one about any but the latest; ``False`` drops such reports
    (a narrower world, for comparison)."""
    rejections_beside_another_in_flight: bool = True
    """Whether the provider may reject a transmission definitively while another of the
    same key is still in flight (two senders on a same-key-replay binding: the second is
    turned away, say for quota, and the first then lands). The kernel records whether the
    latest grant overlapped an earlier lease and then refuses the rejection; ``False``
    leaves such a rejection out."""
    stale_lookups: bool = True
    """Whether a lookup that found nothing may reach the kernel some time after it was made
    (the reconciler looks up, then waits for the row lock or pauses). The not-found carries
    the lookup's instant and the kernel judges it against the submit lease at that
    instant; ``False`` makes every lookup and its ``reconcile`` one step. Only a
    not-found can go stale harmfully: a job, once made, stays found, and a late ``Found``
    moves an attempt forward only."""
    reservation: str | None = "gpu-0"

    @property
    def name(self) -> str:
        """``attempts:<provider> <senders>x<generations> <transmissions>tx``, then each
        surrounding the standard bounds leave out that this world lets in."""
        allowed = [label for label, on in (("stale reports", self.stale_reports),
                                           ("rejection beside another in flight",
                                            self.rejections_beside_another_in_flight),
                                           ("stale lookups", self.stale_lookups)) if on]
        return " ".join([f"attempts:{self.provider} {self.senders}x{self.generations} {self.transmissions}tx",
                         *(f"+{label}" for label in allowed)])


@dataclasses.dataclass(frozen=True, slots=True)
class World:
    """The attempt rows, the actors' knowledge, the provider's truth and the clock."""

    now_us: int
    rows: tuple[AttemptRow | None, ...]
    """One per generation (index 0 is generation 1); None before ``prepare``."""
    senders: tuple[tuple[str, int, int, str], ...]
    transmissions: tuple[tuple[tuple[str, int], ...], ...]
    """Per generation, every granted transmission: (what it truly did, its lease's end)."""
    jobs: tuple[tuple[tuple[str, AttemptState], ...], ...]
    """Per generation, the provider's jobs under its key: (identity, state)."""
    lies: int
    """Identities a lying provider made up so far (each one new)."""
    run_closed: bool
    not_found_held: tuple[tuple[int, int], ...]
    """(generation, the instant of the lookup) of each lookup that found nothing, as the
    reconciler holds it before its ``reconcile`` reaches the kernel
    (``Configuration.stale_lookups``)."""
    last: tuple[int, AttemptCommand, Decision] | None = dataclasses.field(default=None, compare=False)
    """What the last step decided (generation index, command, decision): for the
    transition rules only; left out of equality and of the canonical key."""


def _replace(world: World, **changes: Any) -> World:
    fields: dict[str, Any] = {
        "now_us": world.now_us, "rows": world.rows, "senders": world.senders, "transmissions": world.transmissions,
        "jobs": world.jobs, "lies": world.lies, "run_closed": world.run_closed,
        "not_found_held": world.not_found_held, "last": None,
    }
    fields.update(changes)
    return World(**fields)


def _at(items: tuple[Any, ...], index: int, value: Any) -> tuple[Any, ...]:
    return items[:index] + (value,) + items[index + 1:]


# --- the provider's truth ------------------------------------------------------------------


def _in_flight(world: World, generation: int) -> list[int]:
    """Numbers of transmissions still able to reach the provider."""
    return [number for number, (truth, lease_end) in enumerate(world.transmissions[generation], start=1)
            if truth == PENDING and lease_end > world.now_us]


def _may_take_effect(world: World, generation: int, replay: bool) -> bool:
    """Whether a transmission in flight may still make a job (a replay provider answers a
    key that has a job with that job)."""
    return bool(_in_flight(world, generation)) and not (replay and world.jobs[generation])


def _job(world: World, generation: int, identity: str | None) -> tuple[str, AttemptState] | None:
    return next((job for job in world.jobs[generation] if job[0] == identity), None)


class AttemptModel:
    """The world of :class:`Configuration` for :func:`.engine.explore`."""

    def __init__(self, configuration: Configuration = Configuration(),
                 properties: tuple[Property[World], ...] | None = None) -> None:
        assert configuration.provider in PROVIDERS and configuration.senders >= 1 and configuration.generations >= 1
        self.configuration = configuration
        self.name = configuration.name
        self.replay, self.lookup, self.lying = PROVIDERS[configuration.provider]
        self.properties: tuple[Property[World], ...] = PROPERTIES if properties is None else properties
        self._specs = tuple(self._spec_row(generation) for generation in range(configuration.generations))

    # --- the engine's protocol -----------------------------------------------------------

    def initial(self) -> World:
        count = self.configuration.generations
        return World(now_us=NOW_US, rows=(None,) * count, senders=(IDLE,) * self.configuration.senders,
                     transmissions=((),) * count, jobs=((),) * count, lies=0, run_closed=False, not_found_held=())

    def successors(self, state: World) -> Iterator[tuple[Step, World]]:
        for index in range(len(state.senders)):
            yield from self._sender(state, index)
        for generation in range(len(state.rows)):
            yield from self._reconciler(state, generation)
            yield from self._provider(state, generation)
            yield from self._operator(state, generation)
        if not state.run_closed and all(row is None or row.state in TERMINAL_ATTEMPT_STATES for row in state.rows):
            yield Step("operator", "close the Run", "no open attempt"), _replace(state, run_closed=True)
        yield from self._clock(state)

    def canonical(self, state: World) -> Hashable:
        now = state.now_us
        rows = tuple(None if row is None else (
            _KEYED(row),
            # Instants relative to the clock; one already past is like any other past one to
            # every later decision (each compares an instant with now, which never goes back).
            max(row.created_at_us - now, 0), max(row.updated_at_us - now, 0),
            None if row.submit_lease_expires_at_us is None else max(row.submit_lease_expires_at_us - now, 0),
        ) for row in state.rows)
        transmissions = tuple(tuple(
            (truth, lease_end - now) if truth == PENDING and lease_end > now
            else (NEVER_SENT if truth == PENDING else truth, 0)
            for truth, lease_end in sent
        ) for sent in state.transmissions)
        # A held not-found counts only by whether it was looked up during its row's lease:
        # the one comparison the kernel makes with its instant. A later grant only moves
        # the lease's end past it (the grant comes after the lookup), never back.
        held = tuple((generation, self._during_lease(state.rows[generation], instant))
                     for generation, instant in state.not_found_held)
        return (rows, tuple(sorted(state.senders)), transmissions, state.jobs, state.lies, state.run_closed, held)

    @staticmethod
    def _during_lease(row: AttemptRow | None, instant: int) -> bool:
        lease = None if row is None else row.submit_lease_expires_at_us
        return lease is None or instant < lease

    def describe(self, state: World) -> str:
        parts = [f"t+{(state.now_us - NOW_US) // 1_000_000}s"]
        for generation, row in enumerate(state.rows, start=1):
            if row is None:
                parts.append(f"g{generation} absent")
                continue
            notes = [f"#{row.transmissions}"] if row.transmissions else []
            if row.submit_lease_expires_at_us is not None and row.submit_lease_expires_at_us > state.now_us:
                notes.append("lease live")
            if row.no_effect_proof_for is not None:
                notes.append(f"proof #{row.no_effect_proof_for}")
            if row.provider_job_id is not None:
                notes.append(row.provider_job_id)
            if row.cancel_requested:
                notes.append("cancel requested")
            if row.reservation_released:
                notes.append("released")
            parts.append(" ".join([f"g{generation} {row.state.value}", *notes]))
        parts.append(" ".join(
            f"s{index}:idle" if phase == "idle" else f"s{index}:{phase} g{generation + 1}#{number}"
            + (f" {outcome}" if outcome else "")
            for index, (phase, generation, number, outcome) in enumerate(state.senders, start=1)
        ))
        for generation in range(len(state.rows)):
            jobs = ",".join(f"{identity} {job_state.value}" for identity, job_state in state.jobs[generation])
            sent = ",".join(
                f"#{number} {truth if truth != PENDING or lease_end > state.now_us else NEVER_SENT}"
                for number, (truth, lease_end) in enumerate(state.transmissions[generation], start=1)
            )
            if jobs or sent:
                parts.append(f"provider g{generation + 1}: {jobs or 'no job'}; {sent}")
        if state.not_found_held:
            parts.append("reconciler holds not-found " + ",".join(
                f"g{number + 1} looked up at t+{(instant - NOW_US) // 1_000_000}s"
                for number, instant in state.not_found_held))
        if state.run_closed:
            parts.append("Run closed")
        return " | ".join(parts)

    # --- the kernel ------------------------------------------------------------------------

    def _spec_row(self, generation: int) -> AttemptRow:
        number = generation + 1
        return AttemptRow(
            attempt_id=f"attempt-{number}", envelope=ENVELOPE_TAG, owner_job_id="owner-1", run_id="run-1",
            station_attempt_id=None, generation=number, request_digest=_DIGEST, idempotency_key=f"key-{number}",
            binding_json="{}", same_key_replay=self.replay, lookup=self.lookup, target="provider-a", source_refs=(),
            working_refs=(), destination=None, purpose="explore", consent_decision=None, policy_revisions_json="{}",
            reservation=self.configuration.reservation, spec_digest=_DIGEST, state=AttemptState.PREPARED,
            provider_job_id=None, transmissions=0, transmission_egress=(), denied_egress=(),
            submit_lease_expires_at_us=None, no_effect_proof_for=None, granted_during_earlier_lease=False,
            progress_cursor=None, result_refs=(),
            diagnostic_refs=(), usage_json=None, cost_json=None, warnings=(), cancel_requested=False, evidence=(),
            reservation_released=False, created_at_us=NOW_US, updated_at_us=NOW_US,
        )

    def _decide(self, state: World, generation: int, command: AttemptCommand) -> tuple[Decision, World]:
        """The kernel's decision for ``command`` meeting the generation's row now, and the
        world with the decided row stored (the same world when it was refused)."""
        decision = ATTEMPTS.decide(state.rows[generation], command, state.now_us)
        if isinstance(decision, Refused):
            return decision, state
        return decision, _replace(state, rows=_at(state.rows, generation, decision.new_record),
                                  last=(generation, command, decision))

    def _prepare(self, state: World, generation: int) -> Prepare:
        spec = self._specs[generation]
        present = [row for row in state.rows if row is not None]
        _, predecessor, predecessor_generation, held = finders.prepare_meets(
            present, attempt_id=spec.attempt_id, owner_job_id=spec.owner_job_id, idempotency_key=spec.idempotency_key
        )
        return Prepare(row=replace_fields(spec, created_at_us=state.now_us, updated_at_us=state.now_us),
                       predecessor_state=predecessor, predecessor_generation=predecessor_generation,
                       key_held_elsewhere=held, run_closed=state.run_closed)

    @staticmethod
    def _detail(decision: Decision) -> str:
        if isinstance(decision, Refused):
            return f"refused {decision.reason.value}"
        row = decision.new_record
        reply = decision.reply
        if isinstance(reply, TransmissionGranted):
            return f"granted #{reply.number}"
        return "applied" if row is None else f"-> {row.state.value}"

    # --- the senders ------------------------------------------------------------------------

    def _sender(self, state: World, index: int) -> Iterator[tuple[Step, World]]:
        actor = f"sender-{index + 1}"
        phase, generation, number, outcome = state.senders[index]
        if phase == "idle":
            yield from self._idle_sender(state, index, actor)
            return
        transmissions = state.transmissions[generation]
        if phase == GRANTED:
            yield from self._send(state, index, actor)
            # A crash before sending: the transmission never leaves.
            _, lease_end = transmissions[number - 1]
            forgotten = _replace(state, senders=_at(state.senders, index, IDLE), transmissions=_at(
                state.transmissions, generation, _at(transmissions, number - 1, (NEVER_SENT, lease_end))))
            yield Step(actor, "crash", f"before sending g{generation + 1}#{number}"), forgotten
            return
        # SENT: report what the driver answered, or crash (forget it).
        yield Step(actor, "crash", f"after sending g{generation + 1}#{number}"), _replace(
            state, senders=_at(state.senders, index, IDLE))
        if number != len(transmissions) and not self.configuration.stale_reports:
            return
        if outcome == REJECTED:
            command: AttemptCommand = RecordFailed(evidence=FailureKind.REJECTED_BEFORE_EFFECT, reason="rejected",
                                                   transmission=number)
        elif outcome == AMBIGUOUS:
            command = RecordAmbiguous(reason="no_acknowledgement")
        else:
            command = RecordAccepted(provider_job_id=outcome)
        decision, after = self._decide(state, generation, command)
        action = f"{command.kind.value} g{generation + 1}#{number}"
        yield Step(actor, action, self._detail(decision)), _replace(
            after, senders=_at(state.senders, index, IDLE), last=after.last)
        if after != state:
            # Written, but the answer was lost: the sender still holds its news (and may report it again).
            yield Step(actor, action, f"{self._detail(decision)}, acknowledgement lost"), after

    def _idle_sender(self, state: World, index: int, actor: str) -> Iterator[tuple[Step, World]]:
        for generation, row in enumerate(state.rows):
            decision, after = self._decide(state, generation, self._prepare(state, generation))
            if after != state:
                yield Step(actor, f"prepare g{generation + 1}", self._detail(decision)), after
            if row is None or row.transmissions >= self.configuration.transmissions:
                continue
            egress = f"egress-{len(row.transmission_egress) + len(row.denied_egress) + 1}"
            plain = BeginSubmit(egress_decision_id=egress, egress_allowed=True, proof_looked_up_at_us=None,
                                lease_us=LEASE_US)
            moves = list(self._submit(state, index, actor, generation, plain, ""))
            if not moves and self.lookup and not state.jobs[generation]:
                # The caller looked the key up just now, found nothing, and passes that proof.
                proven = dataclasses.replace(plain, proof_looked_up_at_us=state.now_us)
                moves = list(self._submit(state, index, actor, generation, proven, " with a lookup's no-effect proof"))
            yield from moves

    def _submit(self, state: World, index: int, actor: str, generation: int, command: BeginSubmit,
                how: str) -> Iterator[tuple[Step, World]]:
        decision, after = self._decide(state, generation, command)
        action = f"begin_submit g{generation + 1}{how}"
        if not isinstance(decision, Applied) or not isinstance(decision.reply, TransmissionGranted):
            if after != state:
                yield Step(actor, action, self._detail(decision)), after
            return
        number = decision.reply.number
        sent = state.transmissions[generation]
        yield Step(actor, action, self._detail(decision)), _replace(
            after, senders=_at(state.senders, index, (GRANTED, generation, number, "")),
            transmissions=_at(state.transmissions, generation, sent + ((PENDING, state.now_us + command.lease_us),)),
            last=after.last)
        # The grant was written but its answer never reached the sender: nothing is sent.
        yield Step(actor, action, f"{self._detail(decision)}, acknowledgement lost"), _replace(
            after, transmissions=_at(state.transmissions, generation, sent + ((NEVER_SENT, 0),)), last=after.last)

    def _send(self, state: World, index: int, actor: str) -> Iterator[tuple[Step, World]]:
        """The driver call: what the provider truly does with it, and what the sender hears."""
        _, generation, number, _ = state.senders[index]
        transmissions = state.transmissions[generation]
        truth, lease_end = transmissions[number - 1]
        name = f"g{generation + 1}#{number}"

        def sent(result: str, outcome: str, **changes: Any) -> World:
            return _replace(state, senders=_at(state.senders, index, (SENT, generation, number, outcome)),
                            transmissions=_at(state.transmissions, generation,
                                              _at(transmissions, number - 1, (result, lease_end))), **changes)

        if lease_end <= state.now_us:
            # The runner's driver call is bounded by the submit lease: it timed out unsent.
            yield Step(actor, f"send {name}", "timed out at the lease's end"), sent(NEVER_SENT, AMBIGUOUS)
            return
        jobs = state.jobs[generation]
        if self.replay and jobs:
            identity, lies = jobs[0][0], state.lies
            if self.lying:
                lies += 1
                identity = f"lie-{lies}"
            yield Step(actor, f"send {name}", f"replayed, acknowledged {identity}"), sent(
                REPLAYED, identity, lies=lies)
            yield Step(actor, f"send {name}", "replayed, acknowledgement lost"), sent(REPLAYED, AMBIGUOUS, lies=lies)
            return
        identity = f"job-{sum(len(each) for each in state.jobs) + 1}"
        made = _at(state.jobs, generation, jobs + ((identity, AttemptState.ACCEPTED),))
        yield Step(actor, f"send {name}", f"effect, acknowledged {identity}"), sent(EFFECT, identity, jobs=made)
        yield Step(actor, f"send {name}", "effect, acknowledgement lost"), sent(EFFECT, AMBIGUOUS, jobs=made)
        if self.configuration.rejections_beside_another_in_flight or _in_flight(state, generation) == [number]:
            yield Step(actor, f"send {name}", "rejected before any effect"), sent(NO_EFFECT, REJECTED)
        yield Step(actor, f"send {name}", "disconnected before any effect"), sent(NO_EFFECT, AMBIGUOUS)

    # --- the reconciler, the provider, the operator, the clock ------------------------------

    def _reconciler(self, state: World, generation: int) -> Iterator[tuple[Step, World]]:
        row = state.rows[generation]
        if row is None:
            return
        name = f"g{generation + 1}"
        observations: list[tuple[str, AttemptCommand]] = [("expire_submit_lease", ExpireSubmitLease())]
        if self.lookup:
            jobs = state.jobs[generation]
            if jobs:
                identity, job_state = jobs[0]
                observations.append((f"lookup: found {identity} {job_state.value}", self._found(identity, job_state)))
            else:
                observations.append(("lookup: not found", _not_found(state.now_us)))
            observations.append(("lookup: failed", Reconcile(lookup=LookupKind.FAILED)))
        job = _job(state, generation, row.provider_job_id)
        if job is not None:
            identity, job_state = job
            observations.append((f"poll {identity}: {job_state.value}", self._found(identity, job_state)))
            # What the provider confirmed, reported directly (a cancel confirmation, a callback).
            if job_state is AttemptState.CANCELLED:
                observations.append((f"record_cancelled {identity}", RecordCancelled(provider_job_id=identity)))
            elif job_state is AttemptState.RUNNING:
                observations.append(("record_running", RecordRunning()))
            elif job_state is AttemptState.SUCCEEDED:
                observations.append(("record_succeeded", RecordSucceeded(
                    result_refs=(f"ref:{identity}",), diagnostic_refs=(), usage_json=None, cost_json=None)))
            elif job_state is AttemptState.FAILED:
                observations.append(("record_failed (provider failed)", RecordFailed(
                    evidence=FailureKind.PROVIDER_FAILED, reason="provider_failed")))
        if self.configuration.stale_lookups and self.lookup:
            yield from self._stale_lookup(state, generation, observations)
        for action, command in observations:
            decision, after = self._decide(state, generation, command)
            if after != state:
                yield Step("reconciler", f"{action} {name}", self._detail(decision)), after

    def _stale_lookup(self, state: World, generation: int,
                      observations: list[tuple[str, AttemptCommand]]) -> Iterator[tuple[Step, World]]:
        """A not-found held between the lookup and its ``reconcile`` (the one-step version
        stays among ``observations``: a lookup reported at once)."""
        name = f"g{generation + 1}"
        held = state.not_found_held
        mine = [instant for number, instant in held if number == generation]
        if mine:
            rest = tuple(entry for entry in held if entry[0] != generation)
            decision, after = self._decide(state, generation, _not_found(mine[0]))
            reported = _replace(after, not_found_held=rest, last=after.last)
            yield Step("reconciler", f"reconcile {name} with the not-found it held", self._detail(decision)), reported
            yield Step("reconciler", "crash", f"forgets the not-found of {name}"), _replace(state, not_found_held=rest)
        elif not state.jobs[generation]:
            yield Step("reconciler", f"lookup {name}: not found (held)"), _replace(
                state, not_found_held=tuple(sorted((*held, (generation, state.now_us)))))

    @staticmethod
    def _found(identity: str, job_state: AttemptState) -> Reconcile:
        refs = (f"ref:{identity}",) if job_state is AttemptState.SUCCEEDED else ()
        return Reconcile(lookup=LookupKind.FOUND, provider_job_id=identity, found_state=job_state, result_refs=refs)

    def _provider(self, state: World, generation: int) -> Iterator[tuple[Step, World]]:
        row = state.rows[generation]
        jobs = state.jobs[generation]
        for position, (identity, job_state) in enumerate(jobs):
            moves: list[tuple[str, AttemptState]] = []
            if job_state is AttemptState.ACCEPTED:
                moves.append(("starts", AttemptState.RUNNING))
            if job_state is AttemptState.RUNNING:
                moves.append(("succeeds", AttemptState.SUCCEEDED))
            if job_state in _ACTIVE:
                moves.append(("fails", AttemptState.FAILED))
                # It stops only when asked: a runner sends the cancel for the recorded identity.
                if row is not None and row.cancel_requested and row.provider_job_id == identity:
                    moves.append(("stops on the cancel request", AttemptState.CANCELLED))
            for verb, new_state in moves:
                changed = _at(state.jobs, generation, _at(jobs, position, (identity, new_state)))
                yield Step("provider", f"{identity} {verb}"), _replace(state, jobs=changed)

    def _operator(self, state: World, generation: int) -> Iterator[tuple[Step, World]]:
        if state.rows[generation] is None:
            return
        for command in (RequestCancel(), ReleaseReservation()):
            decision, after = self._decide(state, generation, command)
            if after != state:
                yield Step("operator", f"{command.kind.value} g{generation + 1}", self._detail(decision)), after

    @staticmethod
    def _clock(state: World) -> Iterator[tuple[Step, World]]:
        ends = [row.submit_lease_expires_at_us for row in state.rows
                if row is not None and row.submit_lease_expires_at_us is not None]
        ends += [lease_end for sent in state.transmissions for truth, lease_end in sent if truth == PENDING]
        live = [end for end in ends if end > state.now_us]
        if live:
            yield Step("clock", "steps to the end of a submit lease"), _replace(state, now_us=min(live))


# --- properties --------------------------------------------------------------------------


def _replay(row: AttemptRow) -> bool:
    return row.same_key_replay


def _unresolved(state: World, generation: int, row: AttemptRow, settled: tuple[AttemptState, ...]) -> str | None:
    """What of the generation's effect is not in one of ``settled`` states, or may still happen."""
    open_jobs = [f"{identity} {job_state.value}" for identity, job_state in state.jobs[generation]
                 if job_state not in settled]
    if open_jobs:
        return "the provider's " + ", ".join(open_jobs)
    if _may_take_effect(state, generation, _replay(row)):
        numbers = ", ".join(f"#{number}" for number in _in_flight(state, generation))
        return f"transmission {numbers} still in flight"
    return None


def _at_most_one_unproven(state: World) -> str | None:
    for generation, row in enumerate(state.rows):
        if row is None or _replay(row):
            continue
        in_flight = set(_in_flight(state, generation))
        unproven = [number for number, (truth, _) in enumerate(state.transmissions[generation], start=1)
                    if truth == EFFECT or number in in_flight]
        if len(unproven) > 1:
            return (f"g{generation + 1}: transmissions {', '.join(f'#{n}' for n in unproven)} may each have had an "
                    "effect, on a provider without same-key replay")
    return None


def _no_fabricated_failure(state: World) -> str | None:
    for generation, row in enumerate(state.rows):
        if row is not None and row.state is AttemptState.FAILED:
            problem = _unresolved(state, generation, row, (AttemptState.FAILED,))
            if problem is not None:
                return f"g{generation + 1} recorded failed, but {problem}"
    return None


def _cancel_contained(state: World) -> str | None:
    for generation, row in enumerate(state.rows):
        if row is not None and row.state is AttemptState.CANCELLED:
            problem = _unresolved(state, generation, row, (AttemptState.CANCELLED,))
            if problem is not None:
                return f"g{generation + 1} recorded cancelled, but {problem}"
    return None


def _reservation_kept(state: World) -> str | None:
    for generation, row in enumerate(state.rows):
        if row is not None and row.reservation_released:
            problem = _unresolved(state, generation, row, tuple(TERMINAL_ATTEMPT_STATES))
            if problem is not None:
                return f"g{generation + 1} released its reservation, but {problem}"
    return None


def _identity_once(before: World, step: Step, after: World) -> str | None:
    for generation, (old, new) in enumerate(zip(before.rows, after.rows)):
        if old is not None and old.provider_job_id is not None and (
            new is None or new.provider_job_id != old.provider_job_id
        ):
            return (f"g{generation + 1}: the provider's job identity {old.provider_job_id} became "
                    f"{None if new is None else new.provider_job_id}")
    return None


def _generations_in_order(state: World) -> str | None:
    for generation in range(1, len(state.rows)):
        previous = state.rows[generation - 1]
        if state.rows[generation] is not None and (
            previous is None or previous.state not in (AttemptState.FAILED, AttemptState.CANCELLED)
        ):
            return (f"g{generation + 1} prepared while g{generation} is "
                    f"{'absent' if previous is None else previous.state.value}")
    return None


def _closed_run(state: World) -> str | None:
    if state.run_closed:
        open_rows = [f"g{generation} {row.state.value}" for generation, row in enumerate(state.rows, start=1)
                     if row is not None and row.state not in TERMINAL_ATTEMPT_STATES]
        if open_rows:
            return f"the Run is closed with open attempts: {', '.join(open_rows)}"
    return None


def _record_invariants(before: World, step: Step, after: World) -> str | None:
    # Every row of a reachable world was decided by some step (the initial world has none),
    # so checking the rows a step changed checks every row.
    for generation, (old, new) in enumerate(zip(before.rows, after.rows), start=1):
        if new is not None and new is not old:
            broken = record_violations(new)
            if broken:
                return f"g{generation} breaks {', '.join(broken)}"
    return None


def _transition_rules(before: World, step: Step, after: World) -> str | None:
    if after.last is None:
        return None
    generation, command, decision = after.last
    broken = transition_violations(before.rows[generation], command, before.now_us, decision)
    return f"g{generation + 1} {command.kind.value} breaks {', '.join(broken)}" if broken else None


WORLD_PROPERTIES: tuple[Property[World], ...] = (
    Property(
        "at_most_one_transmission_without_proof_of_no_effect",
        "TR-A3; specs/attempts.md (Resubmission)",
        "On a provider without same-key replay, no two transmissions of an attempt may each have had an "
        "effect (or still be in flight): a resubmission needs proof that the latest had none.",
        state=_at_most_one_unproven,
    ),
    Property(
        "no_fabricated_failure",
        "TR-A4; specs/attempts.md (Failure evidence)",
        "A failed attempt has no job at the provider but failed ones, and nothing in flight that could make one: "
        "failed only on a definite rejection, a provider-reported failure, or nothing done.",
        state=_no_fabricated_failure,
    ),
    Property(
        "cancel_contained_only_when_resolved",
        "TR-A5; specs/attempts.md (Cancellation)",
        "A cancelled attempt has no job at the provider but cancelled ones, and nothing in flight that could make "
        "one: never reported contained while a transmission is unresolved.",
        state=_cancel_contained,
    ),
    Property(
        "reservation_kept_until_contained",
        "INV-A6, TR-A7; specs/attempts.md (Reservations)",
        "A released reservation outlives every effect: no job active at the provider, nothing in flight.",
        state=_reservation_kept,
    ),
    Property(
        "identity_recorded_once",
        "TR-A2; specs/attempts.md (Identity)",
        "The first provider job identity recorded is final.",
        step=_identity_once,
    ),
    Property(
        "new_generation_only_over_a_failed_or_cancelled_one",
        "TR-A9; specs/attempts.md (Retries)",
        "A retry generation exists only once its predecessor failed or was cancelled.",
        state=_generations_in_order,
    ),
    Property(
        "closed_run_has_no_open_attempt",
        "TR-A10; specs/attempts.md (Attempts of a Run)",
        "Once the Run is closed (its containment count passed), none of its attempts is open.",
        state=_closed_run,
    ),
)
"""The guarantees as the world sees them: what the provider truly did, what the Run and
the generations show. None of them asks the kernel's own checkers."""

KERNEL_CHECKS: tuple[Property[World], ...] = (
    Property(
        "records_keep_their_invariants",
        "INV-A1 ... INV-A10",
        "Every stored attempt keeps record_violations() empty (checked on every row a step decides).",
        step=_record_invariants,
    ),
    Property(
        "decisions_keep_the_transition_rules",
        "TR-A1 ... TR-A10",
        "Every decision the world took keeps transition_violations() empty.",
        step=_transition_rules,
    ),
)
"""The kernel's own record invariants and transition rules, on every record and decision
the world reaches (not only on generated ones)."""

PROPERTIES: tuple[Property[World], ...] = WORLD_PROPERTIES + KERNEL_CHECKS


def _standard(provider: str, **bounds: Any) -> AttemptModel:
    return AttemptModel(Configuration(provider=provider, **bounds))


STANDARD: list[tuple[AttemptModel, int]] = [
    (_standard("replay"), 32),
    (_standard("lookup_only", transmissions=3), 32),
    (_standard("neither", generations=2), 32),
    (_standard("lying"), 32),
]
"""The standard bounds: 2 senders x 1 attempt for each provider kind (the three honest
ones and the spec's lying provider, which alone can offer a second identity), plus a
retry generation where the provider offers no lookup (the cheapest world in which a
second generation can meet an open first one). ``transmissions`` bounds how many times
the senders ask to transmit one attempt (3 where resubmissions need proof, so that a
proven resubmission can itself be proven and resubmitted).

Every surrounding is let in: stale reports, a rejection beside another transmission in
flight, stale lookups. (Until December 2026 the kernel needed all three left out: a
rejection named no transmission and a not-found no instant, and each broke a property;
the mutants ``rejection_of_any_transmission_fails``, ``rejection_beside_an_earlier_one_fails``
and ``not_found_judged_when_decided`` put each defect back, and these worlds catch them.)

Why 32 actions reach every state that matters: none of these worlds has a state deeper
than 21 actions (each reports ``exhausted=True``: the frontier empties at depth 17, 21,
20 and 17), so every reachable state of each world is visited and the bound only caps a
mistake."""

SOAK: list[tuple[AttemptModel, int]] = [
    (_standard("replay", senders=3, transmissions=3), 40),
    (_standard("lookup_only", senders=3, transmissions=3), 40),
    (_standard("lying", transmissions=3), 40),
    (_standard("lookup_only", generations=2), 48),
    (_standard("replay", generations=2), 48),
]
"""Larger bounds for a soak run (not in CI): three senders, three transmissions, a retry
generation where a replay or a lookup can prove a resubmission. Each exhausts; measured
on a two-core machine (states, deepest level, seconds): 88 229 / 18 / 16;
18 669 / 20 / 3; 47 059 / 18 / 8; 239 155 / 28 / 74; 1 074 613 / 27 / 250. A third
sender adds nothing where the provider offers no lookup (only one transmission is ever
granted there), so ``neither`` is not soaked wider."""
