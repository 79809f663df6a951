"""Replay decisions: what one call of a replayed workflow does at its journal position, as a table.

Theory of operation
-------------------
A hop of a Run runs its workflow from the top. The workflow context numbers the calls the
workflow makes through it (0, 1, 2, ...: its *positions*) and keeps, in the Run's step
journal, one entry per position: the *call* (its kind and the code's name for it,
``step:reserve``, ``consent:refund``, ``sleep``) and what it answered. A park writes, in
the Run's checkpoint, the position and call of the wait it parks on; the hop that wait's
decided owner resumes reads them back (:class:`Parked`).

For the call the workflow asks for at one position, the context observes a
:class:`Situation`: the position, the asked call, the call the journal holds there (None:
nothing) and the resumed wait's position and call (None: the hop resumed no replayed
wait). :func:`case_of` sorts it into one :class:`Case` (a total function); :data:`TABLE`
holds, per case, an ordered list of rules; the first whose guard holds names the
:class:`Action`:

- ``answer_recorded``: the journal holds this same call here; its recorded answer is the
  answer (a step's body does not run again, a consent is not asked again);
- ``answer_owner``: the journal holds nothing here and this is where the resumed wait
  parked, on this same call; the decided owner's answer is recorded here, then returned;
- ``diverged``: the Run's history holds another call here, or nothing at a position
  before the resumed wait (the Run passed it, so the journal must hold it); the hop ends
  and the Run fails ``workflow_diverged``: a workflow must make the same calls in the same
  order on every hop, and no answer meant for one call is ever given to another;
- ``run``: the journal holds nothing here and the position lies past the resumed wait (or
  the hop resumed none): the call runs for real (a step runs, a wait parks the Run).

Every :class:`Verdict` names its position, the asked call and what the history holds
there (the journal's call, else the parked call at the parked position, else
:data:`NOTHING`): the stored error of a divergence shows exactly those three.

Nothing here reads the journal or the checkpoint: the context observes, the table decides,
the context acts. ``specs/replay.md`` is this table; :func:`verdict_violations` writes the
rules REPLAY-1 ... REPLAY-5 again, independently of the guards.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable

__all__ = [
    "NOTHING",
    "Case",
    "Action",
    "Held",
    "Parked",
    "Situation",
    "Verdict",
    "ReplayRule",
    "GUARDS",
    "ROWS",
    "TABLE",
    "case_of",
    "decide",
    "verdict_violations",
]

NOTHING = "nothing"
"""What a verdict names as held at a position where the Run's history holds no call (no
call is spelled so: a call is a kind, ``step``, ``consent``, ``sleep``, ..., and a name)."""


class Case(enum.Enum):
    """Where a position stands in the Run's history (values are the spec's names)."""

    RECORDED = "recorded"
    """The journal holds an entry at the position."""
    BEFORE_WAIT = "before_wait"
    """Nothing recorded; the hop resumed a wait parked at a later position."""
    AT_WAIT = "at_wait"
    """Nothing recorded; the hop resumed the wait parked at this position."""
    PAST_WAIT = "past_wait"
    """Nothing recorded; the hop resumed a wait parked at an earlier position."""
    NO_WAIT = "no_wait"
    """Nothing recorded; the hop resumed no replayed wait."""


class Action(enum.Enum):
    """What the call at the position does (values are the spec's names)."""

    ANSWER_RECORDED = "answer_recorded"
    ANSWER_OWNER = "answer_owner"
    DIVERGED = "diverged"
    RUN = "run"


class Held(enum.Enum):
    """Which call a verdict names as the one the Run's history holds at the position."""

    ENTRY = "entry"
    """The call of the journal's entry."""
    PARKED_CALL = "parked_call"
    """The call the resumed wait parked on."""
    NOTHING = "nothing"
    """No call (:data:`NOTHING`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Parked:
    """The wait a resumed hop resumed from, as its park recorded it: its position and call."""

    position: int
    call: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Situation:
    """One call of a replayed workflow as the context sees it (see the module docstring)."""

    position: int
    asked: str
    """The call the workflow asks for now: its kind and the code's name for it."""
    recorded: str | None = None
    """The call of the journal's entry at the position (None: the journal holds none)."""
    parked: Parked | None = None
    """The wait this hop resumed from (None: the hop resumed no replayed wait)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """The action, the position, the call the Run's history holds there (:data:`NOTHING`
    when none) and the call asked for: a divergence's stored error names all three."""

    action: Action
    position: int
    held: str
    asked: str


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayRule:
    guard: str
    action: Action
    held: Held


# --- the case of a situation --------------------------------------------------------------


def case_of(situation: Situation) -> Case:
    """The situation's case; total over every position, recorded call and parked wait.

    post: (__return__ is Case.RECORDED) == (situation.recorded is not None)
    post: (__return__ is Case.NO_WAIT) == (situation.recorded is None and situation.parked is None)
    post: __return__ is not Case.AT_WAIT or situation.parked.position == situation.position
    """
    parked = situation.parked
    if situation.recorded is not None:
        return Case.RECORDED
    if parked is None:
        return Case.NO_WAIT
    if situation.position < parked.position:
        return Case.BEFORE_WAIT
    if situation.position == parked.position:
        return Case.AT_WAIT
    return Case.PAST_WAIT


# --- guards: named predicates over a situation ------------------------------------------


GUARDS: dict[str, Callable[[Situation], bool]] = {
    "always": lambda s: True,
    "call_differs": lambda s: s.recorded != s.asked,
    "parked_call_differs": lambda s: s.parked is None or s.parked.call != s.asked,
}


# --- the table ----------------------------------------------------------------------------

A, H, K = Action, Held, Case


def _rules(*rules: tuple[str, Action, Held]) -> tuple[ReplayRule, ...]:
    return tuple(ReplayRule(*rule) for rule in rules)


ROWS: tuple[tuple[Case, tuple[ReplayRule, ...]], ...] = (
    # In the order of specs/replay.md's table: (case, rules).
    (K.RECORDED, _rules(("call_differs", A.DIVERGED, H.ENTRY), ("always", A.ANSWER_RECORDED, H.ENTRY))),
    (K.BEFORE_WAIT, _rules(("always", A.DIVERGED, H.NOTHING))),
    (K.AT_WAIT, _rules(("parked_call_differs", A.DIVERGED, H.PARKED_CALL),
                       ("always", A.ANSWER_OWNER, H.PARKED_CALL))),
    (K.PAST_WAIT, _rules(("always", A.RUN, H.NOTHING))),
    (K.NO_WAIT, _rules(("always", A.RUN, H.NOTHING))),
)

TABLE: dict[Case, tuple[ReplayRule, ...]] = dict(ROWS)


def decide(situation: Situation) -> Verdict:
    """What the call at the situation's position does: the first rule of its case whose
    guard holds.

    pre: situation.position >= 0
    pre: situation.parked is None or situation.parked.position >= 0
    post: not verdict_violations(situation, __return__)
    post: __return__.position == situation.position and __return__.asked == situation.asked
    post: __return__.action is not Action.ANSWER_RECORDED or situation.recorded == situation.asked
    post: __return__.action is not Action.RUN or situation.recorded is None
    """
    for rule in TABLE[case_of(situation)]:
        if GUARDS[rule.guard](situation):
            return _verdict(situation, rule)
    raise AssertionError("unreachable: every rule list ends in always")  # pragma: no cover


def _verdict(situation: Situation, rule: ReplayRule) -> Verdict:
    held = {
        Held.ENTRY: situation.recorded,
        Held.PARKED_CALL: situation.parked.call if situation.parked is not None else None,
        Held.NOTHING: NOTHING,
    }[rule.held]
    # A rule names only a call its case has (an entry where one is recorded, the parked
    # call at the parked position); NOTHING otherwise keeps the function total.
    return Verdict(rule.action, situation.position, held if held is not None else NOTHING, situation.asked)


# --- the rules every verdict keeps (REPLAY-1 ... REPLAY-5 in specs/replay.md) ---------------


def verdict_violations(situation: Situation, verdict: Verdict) -> list[str]:
    """The replay rules a verdict breaks, written independently of the cases and guards."""
    s, v = situation, verdict
    parked = s.parked
    broken: list[str] = []
    at_wait = s.recorded is None and parked is not None and parked.position == s.position
    before_wait = s.recorded is None and parked is not None and s.position < parked.position
    if (v.action is Action.ANSWER_RECORDED) != (s.recorded is not None and s.recorded == s.asked):
        broken.append("REPLAY-1")  # the journal answers exactly its own call, and a recorded call is never redone
    if (v.action is Action.ANSWER_OWNER) != (at_wait and parked is not None and parked.call == s.asked):
        broken.append("REPLAY-2")  # a resumed wait answers only at its own position, with its own call
    other_call = (s.recorded is not None and s.recorded != s.asked) or (
        at_wait and parked is not None and parked.call != s.asked)
    if (v.action is Action.DIVERGED) != (other_call or before_wait):
        broken.append("REPLAY-3")  # another call held here, or nothing before the wait: diverged
    past = s.recorded is None and (parked is None or s.position > parked.position)
    if (v.action is Action.RUN) != past:
        broken.append("REPLAY-4")  # a call runs for real only where nothing is recorded, past the wait
    held = s.recorded if s.recorded is not None else parked.call if at_wait and parked is not None else NOTHING
    if (v.position, v.held, v.asked) != (s.position, held, s.asked):
        broken.append("REPLAY-5")  # every verdict names the position and both calls
    return broken
